"""The typed, frozen configuration: TOML loading, validation and the only home of defaults."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllmwatch.config import flags, safefile
from vllmwatch.config.bounds import DAY, bounds_of
from vllmwatch.config.convert import CONVERTERS, choice, show
from vllmwatch.config.errors import ConfigError, Problem, line_of, raise_all
from vllmwatch.config.hosts import clashes, listen_problem, parse_address, parse_listen

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

DEFAULT_PATH = "/etc/vllmwatch/vllmwatch.toml"
HOUR = 3600.0
__all__ = ["Config", "ConfigError", "Problem", "config_path", "from_dict", "line_of", "load"]


def _conv(kind: str, default: object, **extra: Any) -> Any:
    """A dataclass field carrying how to convert and describe its TOML value."""
    if isinstance(default, (list, dict)):
        # A fresh copy per instance; frozen dataclasses still share mutable defaults otherwise.
        return field(default_factory=lambda: type(default)(default),
                     metadata={"kind": kind, **extra})
    return field(default=default, metadata={"kind": kind, **extra})


@dataclass(frozen=True)
class VllmConfig:
    """How to launch the supervised vLLM server."""

    model: str = _conv("str", "")
    command: list[str] = _conv("str_list", ["vllm", "serve"])
    served_model_name: str = _conv("str", "")
    host: str = _conv("str", "127.0.0.1")
    port: int = _conv("port", 8000)
    gpus: list[int] | None = _conv("gpus", None)
    env: dict[str, str] = _conv("str_table", {})
    args: dict[str, object] = _conv("args_table", {})
    extra_args: list[str] = _conv("str_list", [])
    api_key_file: str = _conv("str", "")

    @property
    def model_name(self) -> str:
        """The name clients (and our canary) use for the model."""
        return self.served_model_name or self.model

    @property
    def uses_gpu(self) -> bool:
        """False only for a config that says `gpus = []` (a CPU deployment)."""
        return self.gpus is None or len(self.gpus) > 0


@dataclass(frozen=True)
class StartupConfig:
    """Limits on a start: total time and time without log progress."""

    timeout: float = _conv("duration", 1800.0, low=1.0)
    stall_timeout: float = _conv("duration", 300.0, low=1.0)


@dataclass(frozen=True)
class ProbeConfig:
    """Health, metrics and canary probing."""

    interval: float = _conv("duration", 5.0)
    timeout: float = _conv("duration", 5.0, high=HOUR)
    failure_threshold: int = _conv("pos_int", 3)
    metrics_interval: float = _conv("duration", 15.0)
    canary_interval: float = _conv("duration", 60.0)
    canary_timeout: float = _conv("duration", 30.0, high=HOUR)
    canary_prompt: str = _conv("str", "Hello")
    stall_timeout: float = _conv("duration", 300.0, low=1.0)
    # The canary follows the model (issue 16): see core/canary.py and _canary_checks below.
    canary: str = _conv("choice", "auto", choices=("auto", "completions", "chat", "embeddings",
                                                   "score", "rerank", "classify", "pooling",
                                                   "custom"))
    canary_path: str = _conv("str", "")
    canary_body: str = _conv("str", "")


@dataclass(frozen=True)
class MemoryConfig:
    """Memory sampling and the leak rules; a limit left at 0 is off."""

    sample_interval: float = _conv("duration", 10.0)
    pss_interval: float = _conv("duration", 60.0)
    gpu_limit: float = _conv("size", 0.0)
    gpu_growth_limit: float = _conv("size", 0.0)
    gpu_growth_rate: float = _conv("rate", 0.0)
    host_limit: float = _conv("size", 0.0)
    host_growth_limit: float = _conv("size", 0.0)
    host_growth_rate: float = _conv("rate", 0.0)
    baseline_delay: float = _conv("duration", 600.0, zero="take the baseline at READY")
    slope_window: float = _conv("duration", 21600.0, low=10.0)
    sustain: int = _conv("pos_int", 3)
    # -- unified memory (DGX Spark): detection, the start guard, memory-failure retries --
    unified: str = _conv("auto_bool", "auto")  # "auto" | "true" | "false"
    guard: bool = _conv("bool", True)  # the start guard on unified memory (never on discrete)
    guard_floor: float = _conv("size", 0.0, zero="auto: max(4GiB, 5% of MemTotal)")
    guard_interval: float = _conv("duration", 1.0, high=60.0)
    guard_min_gap: float = _conv("duration", 5.0, high=HOUR, zero="act at every sample")
    guard_drop_caches: bool = _conv("bool", False)  # echo 1 > /proc/sys/vm/drop_caches (root)
    guard_compact: bool = _conv("bool", False)  # echo 1 > /proc/sys/vm/compact_memory (root)
    start_memory_retries: int = _conv("pos_int", 2, high=100)  # memory-failed starts retried


@dataclass(frozen=True)
class RestartConfig:
    """The restart ladder, backoff and crash-loop guard."""

    drain_timeout: float = _conv("duration", 30.0, high=DAY, zero="no drain: stop at once")
    stop_timeout: float = _conv("duration", 30.0, high=HOUR)
    backoff_initial: float = _conv("duration", 5.0, high=DAY)
    backoff_max: float = _conv("duration", 300.0, high=DAY)
    backoff_multiplier: float = _conv("pos_float", 2.0)
    backoff_jitter: float = _conv("fraction", 0.2, zero="no jitter")
    stable_after: float = _conv("duration", 600.0, low=1.0)
    max_restarts: int = _conv("pos_int", 5)
    window: float = _conv("duration", 1800.0, low=1.0)
    kill_stale: bool = _conv("bool", True)
    quiet_hours: str = _conv("quiet_hours", "")
    quiet_hours_spread: float = _conv("fraction", 0.5, zero="no spread: the window as written")
    gpu_release_timeout: float = _conv("duration", 60.0, high=DAY,
                                       zero="do not wait for the GPU to release memory")
    gpu_release_tolerance: float = _conv("size", 512.0,
                                         zero="device memory must return to its exact level")
    # A pre-imported interpreter for the next launch (shell/standby.py, core/standby.py).
    standby: str = _conv("auto_bool", "auto")  # "auto" | "true" | "false"
    standby_imports: list[str] = _conv("str_list", [])  # more modules it imports ahead


@dataclass(frozen=True)
class PrewarmConfig:
    """What to do before a start so that it is fast."""

    enabled: bool = _conv("bool", True)
    cache_dir: str = _conv("str", "/var/cache/vllmwatch")
    page_cache: bool = _conv("bool", True)
    page_cache_max_fraction: float = _conv("fraction", 0.5,
                                           zero="never read weights into the page cache")
    page_cache_workers: int = _conv("pos_int", 4, high=256)
    kernels: bool = _conv("bool", False)  # off: ~13 s before each start, no gain (docs/GPU.md)
    warmup_request: bool = _conv("bool", True)
    timeout: float = _conv("duration", 600.0, high=DAY)
    required: bool = _conv("bool", False)


@dataclass(frozen=True)
class StatusConfig:
    """The read-only HTTP status listener."""

    listen: str = _conv("str", "127.0.0.1:9101")
    allow_remote: bool = _conv("bool", False)


@dataclass(frozen=True)
class LogConfig:
    """Logging of our events and of the child's lines."""

    level: str = _conv("choice", "info", choices=("debug", "info", "warning", "error"))
    format: str = _conv("choice", "auto", choices=("auto", "journal", "json", "console"))
    child_lines: bool = _conv("bool", True)


# --- [drain] and [gate] (issue 15: restarts that clients do not see) ---------------------


@dataclass(frozen=True)
class DrainConfig:
    """How a planned restart leaves a load balancer: /readyz 503, then wait, then drain."""

    # A balancer stops routing after interval x fall failed checks (e.g. 2 s x 3 = 6 s);
    # 10 s covers that with a margin. 0 stops as soon as nothing is in flight.
    deregister_delay: float = _conv("duration", 10.0, high=HOUR,
                                    zero="stop as soon as nothing is in flight")


@dataclass(frozen=True)
class GateConfig:
    """The optional front door: hold requests while vLLM (re)starts instead of failing them."""

    enabled: bool = _conv("bool", False)
    listen: str = _conv("str", "")  # the public HOST:PORT; vllm.port becomes the private one
    hold_timeout: float = _conv("duration", 120.0, high=DAY)
    retry_after: float = _conv("duration", 10.0, high=DAY)


@dataclass(frozen=True)
class Config:
    """The whole configuration, plus where it came from."""

    vllm: VllmConfig = field(default_factory=VllmConfig)
    startup: StartupConfig = field(default_factory=StartupConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    restart: RestartConfig = field(default_factory=RestartConfig)
    prewarm: PrewarmConfig = field(default_factory=PrewarmConfig)
    status: StatusConfig = field(default_factory=StatusConfig)
    log: LogConfig = field(default_factory=LogConfig)
    drain: DrainConfig = field(default_factory=DrainConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    path: str = ""
    sha256: str = ""


SECTIONS: dict[str, type] = {
    "vllm": VllmConfig,
    "startup": StartupConfig,
    "probe": ProbeConfig,
    "memory": MemoryConfig,
    "restart": RestartConfig,
    "prewarm": PrewarmConfig,
    "status": StatusConfig,
    "log": LogConfig,
    "drain": DrainConfig,
    "gate": GateConfig,
}


def config_path(cli_value: str | None) -> str:
    """The config file to read: --config, then $VLLMWATCH_CONFIG, then the default."""
    return cli_value or os.environ.get("VLLMWATCH_CONFIG") or DEFAULT_PATH


def load(path: str) -> Config:
    """Read, parse and validate a config file; raise ConfigError listing every problem."""
    try:
        raw = safefile.read_bounded(path)
    except safefile.FileProblem as exc:
        hint = " (pass --config PATH or set VLLMWATCH_CONFIG)" if exc.transient else ""
        raise ConfigError(path, "", f"{exc}{hint}") from None
    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise ConfigError(path, "", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "", f"invalid TOML: {exc}") from None
    try:
        config = from_dict(data, path)
    except ConfigError as exc:
        raise exc.with_lines(text) from None
    return dataclasses.replace(config, sha256=hashlib.sha256(raw).hexdigest())


def from_dict(data: Mapping[str, object], path: str = "<config>") -> Config:
    """Validate a parsed TOML document into a Config; one ConfigError lists all problems."""
    problems = _unknown(data.keys(), SECTIONS.keys(), "", "section")
    sections: dict[str, object] = {}
    for name, cls in SECTIONS.items():
        table = data.get(name, {})
        if not isinstance(table, dict):
            problems.append(Problem(name, f"expected a table [{name}], got {show(table)}"))
            table = {}
        sections[name] = _section(cls, table, name, problems)
    config = Config(path=path, **sections)  # type: ignore[arg-type]
    problems += _cross_checks(config)
    if problems:
        # Report the refused flags too, so that one edit cycle fixes the whole file.
        vllm = data.get("vllm")
        if isinstance(vllm, dict):
            problems += flags.args_problems(config.vllm.args, config.vllm.extra_args)
    raise_all(path, problems)
    return config


def _section(cls: type, table: dict[str, object], section: str, problems: list[Problem]
             ) -> object:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    problems += _unknown(table.keys(), fields.keys(), section + ".", "key")
    values = {}
    for name, value in table.items():
        if name not in fields:
            continue
        meta = fields[name].metadata
        key = f"{section}.{name}"
        try:
            values[name] = _convert(meta["kind"], value, key, meta)
        except _Refused as exc:
            problems.append(exc.problem)
    return cls(**values)


def _unknown(got: Any, known: Any, prefix: str, what: str) -> list[Problem]:
    out = []
    for name in got:
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
            hint = f"; did you mean {prefix}{close[0]}?" if close else (
                f"; known: {', '.join(sorted(known))}")
            out.append(Problem(prefix + name, f"unknown {what}{hint}"))
    return out


class _Refused(Exception):
    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.problem)
        self.problem = problem


def _convert(kind: str, value: object, key: str, meta: Mapping[str, Any]) -> object:
    converter, accepted = CONVERTERS[kind]
    bounds = bounds_of(kind, meta)
    wanted = accepted if kind != "choice" else "one of " + ", ".join(
        repr(c) for c in meta["choices"])
    if bounds is not None:
        wanted += f"; accepted: {bounds.describe()}"
    try:
        out = converter(value) if kind != "choice" else choice(value, meta["choices"])
    except (ValueError, TypeError, OverflowError) as exc:
        detail = f" ({exc})" if str(exc) and "not a" not in str(exc) else ""
        raise _Refused(Problem(key, f"bad value {show(value)}{detail}; expected {wanted}")
                       ) from None
    if bounds is not None and isinstance(out, (int, float)):
        why = bounds.problem(float(out))
        if why is not None:
            raise _Refused(Problem(key, f"bad value {show(value)}: {why}; expected {wanted}"))
    return out


def _cross_checks(config: Config) -> list[Problem]:
    out = []
    if not config.vllm.model:
        out.append(Problem("vllm.model", "missing; set it to a local model directory "
                           "or a hub id, e.g. model = \"/srv/models/Qwen3.5-9B\""))
    if not config.vllm.command:
        out.append(Problem("vllm.command", 'empty; expected e.g. ["vllm", "serve"]'))
    if config.restart.backoff_max < config.restart.backoff_initial:
        out.append(Problem("restart.backoff_max", "must be >= restart.backoff_initial "
                           f"({config.restart.backoff_initial:g}s)"))
    why = listen_problem(config.status.listen, config.status.allow_remote)
    if why is not None:
        out.append(Problem("status.listen", f"bad value {config.status.listen!r}: {why}"))
    return out + _canary_checks(config) + _gate_checks(config) + _address_checks(config)


def _address_checks(config: Config) -> list[Problem]:
    """vllm.port, status.listen and gate.listen are three different sockets (issue 23)."""
    listeners = [("vllm.port", config.vllm.host, config.vllm.port)]
    for key, text in (("status.listen", config.status.listen),
                      ("gate.listen", config.gate.listen if config.gate.enabled else "")):
        try:
            parsed = parse_listen(text)
        except ValueError:
            continue  # reported by its own check
        if parsed is not None:
            listeners.append((key, *parsed))
    # gate.listen on vllm.port has its own message in _gate_checks.
    return [Problem(key, why) for key, why in clashes(listeners)
            if not (key == "gate.listen" and "vllm.port" in why)]


# ---- issue 16 (canary kinds); kept apart from the checks above ----

def _canary_checks(config: Config) -> list[Problem]:
    """probe.canary = "custom" needs a path; a body, when given, is a JSON object."""
    p, out = config.probe, []
    if p.canary == "custom" and not p.canary_path.startswith("/"):
        out.append(Problem("probe.canary_path", f"bad value {show(p.canary_path)}; "
                           'probe.canary = "custom" needs a path such as "/v1/embeddings"'))
    if p.canary_body:
        try:
            body = json.loads(p.canary_body)
        except ValueError as exc:
            body = {}  # reported here; not again below
            out.append(Problem("probe.canary_body", f"not JSON ({exc}); expected a JSON "
                               'object such as \'{"model": "m", "input": "Hello"}\''))
        if not isinstance(body, dict):
            out.append(Problem("probe.canary_body", f"bad value {show(p.canary_body)}; "
                               "expected a JSON object"))
    if (p.canary_path or p.canary_body) and p.canary != "custom":
        out.append(Problem("probe.canary", f"is {show(p.canary)} but canary_path or "
                           'canary_body is set; set probe.canary = "custom" to use them'))
    return out


# ---- issue 15 (the [gate] front door); kept apart from the checks above ----

def _gate_checks(config: Config) -> list[Problem]:
    """gate.listen is a HOST:PORT that is not vLLM's own."""
    g = config.gate
    if not g.enabled:
        return []
    try:
        host, port = parse_address(g.listen)
    except ValueError as exc:
        return [Problem("gate.listen", f"bad value {show(g.listen)}: {exc}")]
    if port == config.vllm.port and host in ("", "0.0.0.0", "::", config.vllm.host):
        return [Problem("gate.listen", f"port {port} is vllm.port; the gate takes the public "
                        "port and vLLM moves to a private one: set vllm.port to another port, "
                        "e.g. 8001")]
    return []
