"""The preflight checklist (`vllmwatch check`): small checks, each returning CheckResults.

A check never raises: the runner turns an unexpected error into a FAIL carrying its text.
GPU checks live in checks_gpu.py, model directory checks in checks_model.py, max-model-len
in checks_maxlen.py; this module holds the runner, the output and the config, vLLM, port
and cache checks.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import socket
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import psutil

from vllmwatch.config import command, vllminfo
from vllmwatch.config.schema import Config, ConfigError, load

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"


@dataclass(frozen=True)
class CheckResult:
    """One line of the checklist. status is PASS, WARN, FAIL or SKIP (not run; not a failure)."""

    name: str
    status: str
    detail: str


@dataclass
class Context:
    """What the checks may look at: the config, the child's environment and the seams."""

    config: Config
    fast: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    nvml: Callable[[], Any] | None = None  # returns a pynvml-like module, or None
    progress: TextIO | None = None


Check = Callable[[Context], "CheckResult | list[CheckResult]"]


def main(path: str, as_json: bool, fast: bool, *, nvml: Callable[[], Any] | None = None,
         out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the checklist for the config at path and print it; 0 if nothing failed, else 1."""
    out, err = out or sys.stdout, err or sys.stderr
    show_progress = not as_json or err.isatty()
    results = run(path, fast=fast, env=os.environ, nvml=nvml,
                  progress=err if show_progress else None)
    try:
        print(render_json(results) if as_json else render_text(results, path), file=out)
        out.flush()
    except BrokenPipeError:  # `vllmwatch check | head`: the reader left; not our failure
        pass
    return 1 if any(r.status == FAIL for r in results) else 0


def run(path: str, *, fast: bool = False, env: Mapping[str, str] | None = None,
        nvml: Callable[[], Any] | None = None, progress: TextIO | None = None
        ) -> list[CheckResult]:
    """Load the config and run every check; a config that does not load is the only result."""
    try:
        config = load(path)
    except ConfigError as exc:
        return [CheckResult("config", FAIL, str(exc))]
    except Exception as exc:  # a bug in loading must still not print a traceback
        return [CheckResult("config", FAIL, f"{path}: cannot load: {_exc_text(exc)}")]
    child_env = {**(env if env is not None else os.environ), **config.vllm.env}
    ctx = Context(config, fast, child_env, nvml, progress)
    results: list[CheckResult] = []
    for name, check in CHECKS:
        results += run_one(name, check, ctx)
    return results


def run_one(name: str, check: Check, ctx: Context) -> list[CheckResult]:
    """Run one check; an exception becomes a FAIL result instead of a traceback."""
    try:
        got = check(ctx)
    except OSError as exc:  # unreadable files, permissions: the operator's to fix
        return [CheckResult(name, FAIL, f"cannot read {exc.filename or ''}: {exc.strerror or exc}")]
    except Exception as exc:
        return [CheckResult(name, FAIL, f"check crashed: {_exc_text(exc)} (a vllmwatch bug; "
                            "please report it)")]
    return got if isinstance(got, list) else [got]


def _exc_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def render_text(results: Sequence[CheckResult], path: str = "") -> str:
    """One line per result, aligned, then a count line."""
    width = max((len(r.name) for r in results), default=0)
    lines = [f"vllmwatch check: {path}"] if path else []
    lines += [f"{r.status}  {r.name:<{width}}  {r.detail}" for r in results]
    counts = {s: sum(r.status == s for r in results) for s in (PASS, WARN, FAIL, SKIP)}
    lines.append(f"{counts[PASS]} passed, {counts[WARN]} warned, {counts[FAIL]} failed, "
                 f"{counts[SKIP]} skipped")
    return "\n".join(lines)


def render_json(results: Sequence[CheckResult]) -> str:
    """A JSON list of {name, status, detail}."""
    return json.dumps([asdict(r) for r in results], indent=2)


# --- config and vLLM -------------------------------------------------------------------------

def check_config(ctx: Context) -> CheckResult:
    """The config loads (done by run), the api key file reads and the command builds."""
    c = ctx.config
    try:
        cmd = command.build(c, ctx.env, api_key=command.read_api_key(c))
    except ConfigError as exc:
        return CheckResult("config", FAIL, str(exc))
    return CheckResult("config", PASS,
                       f"{c.path}: {shlex.join(command.redact_argv(cmd.argv))}")


def check_vllm(ctx: Context) -> CheckResult:
    """The vLLM program is on PATH; its version from package metadata unless --fast."""
    cmd = ctx.config.vllm.command
    exe = vllminfo.executable(cmd)
    if exe is None:
        return CheckResult("vllm", FAIL, f"{cmd[0]!r} not found on PATH; install vLLM "
                           "(pip install vllm) or set vllm.command to its full path")
    if ctx.fast:
        return CheckResult("vllm", PASS, exe)
    ver = vllminfo.version(cmd)
    return CheckResult("vllm", PASS, f"{exe} (vLLM {ver})" if ver else f"{exe} (version unknown)")


# --- port and caches -------------------------------------------------------------------------

def describe_pid(pid: int | None) -> str:
    """'pid 123 (vllm serve ...)' for a human, tolerating vanished and foreign processes."""
    if pid is None:
        return "a process we may not see (another user?)"
    try:
        proc = psutil.Process(pid)
        cmd = " ".join(proc.cmdline()) or proc.name()
    except (psutil.Error, OSError):
        return f"pid {pid}"
    return f"pid {pid} ({cmd[:80]}{'...' if len(cmd) > 80 else ''})"


def port_holders(port: int) -> list[int | None]:
    """The pids listening on a TCP port (None for one we may not see)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    return sorted({c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr
                   and c.laddr.port == port}, key=lambda p: p or 0)


def _bind_error(family: int, addr: Any, reuse: bool) -> OSError | None:
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, int(reuse))
        try:
            sock.bind(addr)
        except OSError as exc:
            return exc
    return None


def check_port(ctx: Context) -> CheckResult:
    """vllm.host:vllm.port can be bound; if not, name who holds it."""
    host, port = ctx.config.vllm.host, ctx.config.vllm.port
    where = f"{host}:{port}"
    try:
        family, _, _, _, addr = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        return CheckResult("port", FAIL, f"vllm.host {host!r} does not resolve ({exc.strerror})")
    err = _bind_error(family, addr, reuse=False)
    if err is None:
        return CheckResult("port", PASS, f"{where} is free")
    if err.errno == errno.EADDRINUSE:
        holders = port_holders(port)
        if holders:
            return CheckResult("port", FAIL, f"{where} is in use by "
                               f"{', '.join(describe_pid(p) for p in holders)}; stop it or "
                               "change vllm.port")
        if _bind_error(family, addr, reuse=True) is None:
            # uvicorn sets SO_REUSEADDR, so lingering TIME_WAIT connections do not stop vLLM.
            return CheckResult("port", PASS, f"{where} is free (only closing connections "
                               "linger on it)")
        return CheckResult("port", FAIL, f"{where} is in use by a process not visible here; "
                           f"find it with: ss -ltnp 'sport = :{port}' (as root)")
    if err.errno == errno.EADDRNOTAVAIL:
        return CheckResult("port", FAIL, f"vllm.host {host!r} is not an address of this "
                           "machine; use 127.0.0.1, 0.0.0.0 or one of its addresses")
    if err.errno == errno.EACCES:
        return CheckResult("port", FAIL, f"binding {where} is not permitted (a port below "
                           "1024 needs CAP_NET_BIND_SERVICE); use a port >= 1024")
    return CheckResult("port", FAIL, f"cannot bind {where}: {err.strerror}")


def check_prewarm_cache(ctx: Context) -> CheckResult:
    """prewarm.cache_dir is writable, or can be created."""
    pre = ctx.config.prewarm
    if not pre.enabled:
        return CheckResult("prewarm.cache_dir", SKIP, "prewarm.enabled = false")
    path = Path(pre.cache_dir).expanduser()
    if path.is_dir():
        try:
            with tempfile.TemporaryFile(dir=path):
                pass
        except OSError as exc:
            return CheckResult("prewarm.cache_dir", WARN, f"{path} is not writable "
                               f"({exc.strerror}); caches will be cold after every restart: "
                               "make it writable for the service user (CacheDirectory=)")
        return CheckResult("prewarm.cache_dir", PASS, f"{path} is writable")
    parent = next((p for p in path.parents if p.exists()), Path("/"))
    if path.exists() or not os.access(parent, os.W_OK | os.X_OK):
        return CheckResult("prewarm.cache_dir", WARN, f"{path} is not a directory and cannot "
                           f"be created here ({parent} is not writable); create it for the "
                           "service user (systemd CacheDirectory=vllmwatch does)")
    return CheckResult("prewarm.cache_dir", PASS, f"{path} does not exist yet; it can be "
                       "created")


def _check_model(ctx: Context) -> list[CheckResult]:
    from vllmwatch.check import (
        model as checks_model,  # imports this module: keep it out of the import cycle
    )

    return checks_model.check_model(ctx)


def _check_max_model_len(ctx: Context) -> CheckResult:
    from vllmwatch.check import (
        maxlen as checks_maxlen,  # imports this module: keep it out of the import cycle
    )

    return checks_maxlen.check_max_model_len(ctx)


def _check_gpus(ctx: Context) -> list[CheckResult]:
    from vllmwatch.check import (
        gpu as checks_gpu,  # imports this module: keep it out of the import cycle
    )

    return checks_gpu.check_gpus(ctx.config.vllm.gpus, ctx.nvml or checks_gpu.load_nvml)


def _check_platform(ctx: Context) -> list[CheckResult]:
    from vllmwatch.check import unified  # imports this module: keep it out of the import cycle

    return unified.check_platform(ctx)


CHECKS: tuple[tuple[str, Check], ...] = (
    ("config", check_config),
    ("vllm", check_vllm),
    ("model", _check_model),
    ("max-model-len", _check_max_model_len),
    ("port", check_port),
    ("gpu", _check_gpus),
    ("platform", _check_platform),
    ("prewarm.cache_dir", check_prewarm_cache),
)
