"""The typed, frozen configuration: TOML loading, validation and the only home of defaults."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllmwatch.config.convert import CONVERTERS, choice, show

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

DEFAULT_PATH = "/etc/vllmwatch/vllmwatch.toml"


class ConfigError(Exception):
    """A config problem a person can act on: file, key, value and what is accepted."""

    def __init__(self, path: str, key: str, problem: str, line: int | None = None) -> None:
        self.path, self.key, self.problem, self.line = path, key, problem, line
        place = f"{path}:{line}" if line else path
        where = f"{place}: {key}" if key else place
        super().__init__(f"{where}: {problem}")


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

    timeout: float = _conv("duration", 1800.0)
    stall_timeout: float = _conv("duration", 300.0)


@dataclass(frozen=True)
class ProbeConfig:
    """Health, metrics and canary probing."""

    interval: float = _conv("duration", 5.0)
    timeout: float = _conv("duration", 5.0)
    failure_threshold: int = _conv("pos_int", 3)
    metrics_interval: float = _conv("duration", 15.0)
    canary_interval: float = _conv("duration", 60.0)
    canary_timeout: float = _conv("duration", 30.0)
    canary_prompt: str = _conv("str", "Hello")
    stall_timeout: float = _conv("duration", 300.0)


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
    baseline_delay: float = _conv("duration", 600.0)
    slope_window: float = _conv("duration", 21600.0)
    sustain: int = _conv("pos_int", 3)
    # -- unified memory (DGX Spark): detection, the start guard, memory-failure retries --
    unified: str = _conv("auto_bool", "auto")  # "auto" | "true" | "false"
    guard: bool = _conv("bool", True)  # the start guard on unified memory (never on discrete)
    guard_floor: float = _conv("size", 0.0)  # MemFree floor; 0 = max(4 GiB, 5% of MemTotal)
    guard_interval: float = _conv("duration", 1.0)
    guard_min_gap: float = _conv("duration", 5.0)  # between two actions of the guard
    guard_drop_caches: bool = _conv("bool", False)  # echo 1 > /proc/sys/vm/drop_caches (root)
    guard_compact: bool = _conv("bool", False)  # echo 1 > /proc/sys/vm/compact_memory (root)
    start_memory_retries: int = _conv("pos_int", 2)  # memory-failed starts retried, then stop


@dataclass(frozen=True)
class RestartConfig:
    """The restart ladder, backoff and crash-loop guard."""

    drain_timeout: float = _conv("duration", 30.0)
    stop_timeout: float = _conv("duration", 30.0)
    backoff_initial: float = _conv("duration", 5.0)
    backoff_max: float = _conv("duration", 300.0)
    backoff_multiplier: float = _conv("pos_float", 2.0)
    backoff_jitter: float = _conv("fraction", 0.2)
    stable_after: float = _conv("duration", 600.0)
    max_restarts: int = _conv("pos_int", 5)
    window: float = _conv("duration", 1800.0)
    kill_stale: bool = _conv("bool", True)
    quiet_hours: str = _conv("quiet_hours", "")
    gpu_release_timeout: float = _conv("duration", 60.0)
    gpu_release_tolerance: float = _conv("size", 512.0)


@dataclass(frozen=True)
class PrewarmConfig:
    """What to do before a start so that it is fast."""

    enabled: bool = _conv("bool", True)
    cache_dir: str = _conv("str", "/var/cache/vllmwatch")
    page_cache: bool = _conv("bool", True)
    page_cache_max_fraction: float = _conv("fraction", 0.5)
    page_cache_workers: int = _conv("pos_int", 4)
    kernels: bool = _conv("bool", True)
    warmup_request: bool = _conv("bool", True)
    timeout: float = _conv("duration", 600.0)
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
}


def config_path(cli_value: str | None) -> str:
    """The config file to read: --config, then $VLLMWATCH_CONFIG, then the default."""
    return cli_value or os.environ.get("VLLMWATCH_CONFIG") or DEFAULT_PATH


def load(path: str) -> Config:
    """Read, parse and validate a config file; raise ConfigError on any problem."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(path, "", "file not found (pass --config PATH or set "
                          "VLLMWATCH_CONFIG)") from None
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(path, "", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "", f"invalid TOML: {exc}") from None
    try:
        config = from_dict(data, path)
    except ConfigError as exc:
        if exc.line is None and exc.key:
            line = line_of(raw.decode("utf-8"), exc.key)
            if line is not None:
                raise ConfigError(exc.path, exc.key, exc.problem, line) from None
        raise
    return dataclasses.replace(config, sha256=hashlib.sha256(raw).hexdigest())


def line_of(text: str, key: str) -> int | None:
    """The line that sets a dotted key ("memory.gpu_limit") or opens a table ("memory")."""
    section, _, name = key.partition(".")
    name = re.split(r"[.\[]", name)[0]
    current = ""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        header = re.match(r"^\[\s*([\w.-]+)\s*\]", stripped)
        if header:
            current = header.group(1)
            if not name and current == section:
                return number
            continue
        if name and current.split(".")[0] == section and re.match(
                rf"^[\"']?{re.escape(name)}[\"']?\s*=", stripped):
            return number
        if not current and re.match(rf"^{re.escape(section)}\s*=", stripped):
            return number
    return None


def from_dict(data: Mapping[str, object], path: str = "<config>") -> Config:
    """Validate a parsed TOML document into a Config."""
    _reject_unknown(data.keys(), SECTIONS.keys(), path, "", "section")
    sections: dict[str, object] = {}
    for name, cls in SECTIONS.items():
        table = data.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(path, name, f"expected a table [{name}], got {show(table)}")
        sections[name] = _section(cls, table, path, name)
    config = Config(path=path, **sections)  # type: ignore[arg-type]
    _cross_checks(config, path)
    return config


def _section(cls: type, table: dict[str, object], path: str, section: str) -> object:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    _reject_unknown(table.keys(), fields.keys(), path, section + ".", "key")
    values = {}
    for name, value in table.items():
        meta = fields[name].metadata
        key = f"{section}.{name}"
        values[name] = _convert(meta["kind"], value, path, key, meta)
    return cls(**values)


def _reject_unknown(got: Any, known: Any, path: str, prefix: str, what: str) -> None:
    for name in got:
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
            hint = f"; did you mean {prefix}{close[0]}?" if close else (
                f"; known: {', '.join(sorted(known))}")
            raise ConfigError(path, prefix + name, f"unknown {what}{hint}")


def _convert(kind: str, value: object, path: str, key: str, meta: Mapping[str, Any]) -> object:
    converter, accepted = CONVERTERS[kind]
    try:
        return converter(value) if kind != "choice" else choice(value, meta["choices"])
    except (ValueError, TypeError) as exc:
        wanted = accepted if kind != "choice" else "one of " + ", ".join(
            repr(c) for c in meta["choices"])
        detail = f" ({exc})" if str(exc) and "not a" not in str(exc) else ""
        raise ConfigError(path, key, f"bad value {show(value)}{detail}; expected {wanted}") \
            from None


def _cross_checks(config: Config, path: str) -> None:
    if not config.vllm.model:
        raise ConfigError(path, "vllm.model", "missing; set it to a local model directory "
                          "or a hub id, e.g. model = \"/srv/models/Qwen3.5-9B\"")
    if not config.vllm.command:
        raise ConfigError(path, "vllm.command", 'empty; expected e.g. ["vllm", "serve"]')
    if config.restart.backoff_max < config.restart.backoff_initial:
        raise ConfigError(path, "restart.backoff_max", "must be >= restart.backoff_initial "
                          f"({config.restart.backoff_initial:g}s)")
    if config.probe.canary_timeout <= 0:
        raise ConfigError(path, "probe.canary_timeout", "must be > 0")
