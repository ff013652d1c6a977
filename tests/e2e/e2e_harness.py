"""A minimal harness for the end-to-end tests: vllmwatch as a subprocess over a real vLLM.

`Daemon` writes a TOML config from a dict, starts `python -m vllmwatch run --log-format json`
with a NOTIFY_SOCKET listener of its own, parses the JSON log events as they come, waits on
conditions with deadlines, and finds what is left of the vLLM trees it started. It is kept
to what tests/e2e needs; the loop tests have their own harness.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil

from vllmwatch.child import MARKER, instance_id

REPO = Path(__file__).resolve().parents[2]
TIMES_FILE = REPO / ".cache" / "e2e-times.json"
LEAK_DIR = Path(__file__).resolve().parent / "leak"
SERVED_NAME = "tiny"
Event = dict[str, Any]
TIMES: dict[str, Any] = {}  # scenario -> measured figures, for .cache/e2e-times.json


# ---- small helpers ----

def free_port() -> int:
    """A TCP port that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Nobody listens on 127.0.0.1:port (a bind would succeed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def to_toml(config: Mapping[str, Any]) -> str:
    """Write {section: {key: value or {subkey: value}}} as TOML (enough for our config)."""
    lines: list[str] = []

    def table(name: str, body: Mapping[str, Any]) -> None:
        lines.append(f"[{name}]")
        subtables = []
        for key, value in body.items():
            if isinstance(value, Mapping):
                subtables.append((f"{name}.{key}", value))
            else:
                lines.append(f"{json.dumps(key)} = {_toml_value(value)}")
        lines.append("")
        for sub_name, sub in subtables:
            table(sub_name, sub)

    for section, body in config.items():
        table(section, body)
    return "\n".join(lines)


def http(method: str, url: str, body: Any = None, timeout: float = 30.0) -> tuple[int, Any]:
    """One HTTP request; returns (status, parsed JSON or text)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def cmdline(proc: psutil.Process) -> str:
    """The process's command line as one string ('' when it is gone)."""
    with contextlib.suppress(psutil.Error):
        return " ".join(proc.cmdline())
    return ""


def tree(root_pid: int) -> list[psutil.Process]:
    """The root and its descendants that exist now."""
    try:
        root = psutil.Process(root_pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def find_in_tree(root_pid: int, title: str) -> list[psutil.Process]:
    """Processes of the tree whose command line contains title (e.g. 'VLLM::EngineCore')."""
    return [p for p in tree(root_pid) if title in cmdline(p)]


def wait_until(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    """Poll pred until it returns something truthy; fail with `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


# ---- the NOTIFY_SOCKET listener ----

class NotifyListener:
    """A datagram socket standing in for systemd's notify socket; records (time, line)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[tuple[float, str]] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notify", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            now = time.time()
            for line in data.decode(errors="replace").splitlines():
                self.messages.append((now, line))

    def times(self, line: str) -> list[float]:
        """When each datagram line equal to `line` (e.g. 'READY=1') arrived."""
        return [t for t, msg in list(self.messages) if msg == line]

    def close(self) -> None:
        """Stop listening and remove the socket file."""
        self._stop.set()
        self._thread.join(2)
        self._sock.close()
        with contextlib.suppress(OSError):
            self.path.unlink()


# ---- the daemon ----

class Daemon:
    """One `vllmwatch run` subprocess with its config, log events and notify messages."""

    def __init__(self, config: dict[str, Any], workdir: Path) -> None:
        self.config = config
        self.workdir = workdir
        self.config_path = workdir / "vllmwatch.toml"
        self.config_path.write_text(to_toml(config))
        self.marker = instance_id(str(self.config_path))
        self.port = int(config["vllm"]["port"])
        self.status_url = f"http://{config['status']['listen']}/status"
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "daemon.log"
        self.events: list[Event] = []
        self.raw: list[str] = []
        self._cond = threading.Condition()
        self.notify = NotifyListener(workdir / "notify.sock")
        self.proc: subprocess.Popen[bytes] | None = None
        self.seen_pids: set[int] = set()  # every vLLM tree pid we looked at
        self.pgids: set[int] = set()  # the process group of every child generation
        self.log_closed = False  # vllmwatch's output ended (it exited)

    # -- life cycle --

    def start(self) -> None:
        """Start `vllmwatch run` (JSON logs on stderr)."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("NOTIFY_SOCKET", "PYTHONPATH") and not k.startswith("WATCHDOG_")}
        env["NOTIFY_SOCKET"] = str(self.notify.path)
        argv = [sys.executable, "-m", "vllmwatch", "run", "--config", str(self.config_path),
                "--log-format", "json"]
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        threading.Thread(target=self._read, name="daemon-log", daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.log_path, "w") as out:
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                out.write(line + "\n")
                out.flush()
                try:
                    ev = json.loads(line)
                except ValueError:
                    ev = None
                with self._cond:
                    self.raw.append(line)
                    if isinstance(ev, dict) and "event" in ev:
                        ev["_index"] = len(self.events)
                        self.events.append(ev)
                        if ev["event"] == "child.started" and ev.get("pid"):
                            self.pgids.add(int(ev["pid"]))
                    self._cond.notify_all()
        with self._cond:
            self.log_closed = True
            self._cond.notify_all()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal vllmwatch and wait for its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        with self._cond:  # let the reader take in the last lines (daemon.exit)
            self._cond.wait_for(lambda: self.log_closed, timeout=5)
        return code

    @property
    def running(self) -> bool:
        """vllmwatch itself is still running."""
        return self.proc is not None and self.proc.poll() is None

    # -- log events --

    def find(self, name: str, after: int = 0, **match: Any) -> Event | None:
        """The first event called name at index >= after whose fields match."""
        with self._cond:
            for ev in self.events[after:]:
                if ev["event"] != name:
                    continue
                if all(_matches(ev.get(k), v) for k, v in match.items()):
                    return ev
        return None

    def all(self, name: str, after: int = 0) -> list[Event]:
        """Every event called name at index >= after."""
        with self._cond:
            return [ev for ev in self.events[after:] if ev["event"] == name]

    def mark(self) -> int:
        """An index to search events after (events from now on)."""
        with self._cond:
            return len(self.events)

    def wait_event(self, name: str, timeout: float, after: int = 0, **match: Any) -> Event:
        """Wait for an event; fail with the recent log when it does not come."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                ev = self.find(name, after, **match)
                if ev is not None:
                    return ev
                left = deadline - time.monotonic()
                if left <= 0 or self.log_closed:
                    code = self.proc.poll() if self.proc is not None else None
                    raise AssertionError(
                        f"no {name} {match or ''} within {timeout:.0f}s (vllmwatch exit "
                        f"code: {code}); recent log:\n{self.recent()}")
                self._cond.wait(min(left, 0.5))

    def recent(self, n: int = 40) -> str:
        """The last n lines of vllmwatch's log, for failure messages (long child lines cut)."""
        with self._cond:
            return "\n".join(line[:300] for line in self.raw[-n:])

    # -- the daemon's view and the real processes --

    def status(self) -> dict[str, Any]:
        """vllmwatch's /status document."""
        code, body = http("GET", self.status_url, timeout=5)
        assert code == 200, f"/status answered {code}: {body}"
        assert isinstance(body, dict)
        return body

    def child_tree(self, pid: int) -> list[psutil.Process]:
        """The child's tree now; its pids are remembered for the leftover check."""
        procs = tree(pid)
        self.seen_pids.update(p.pid for p in procs)
        return procs

    def leftovers(self) -> list[psutil.Process]:
        """Processes of any vLLM tree this daemon started that still exist."""
        me = os.getpid()
        daemon_pid = self.proc.pid if self.proc is not None else -1
        left = []
        for proc in psutil.process_iter():
            if proc.pid in (me, daemon_pid):
                continue
            with contextlib.suppress(psutil.Error, OSError):
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                ours = os.getpgid(proc.pid) in self.pgids
                ours = ours or (proc.pid in self.seen_pids and "VLLM::" in cmdline(proc))
                ours = ours or proc.environ().get(MARKER) == self.marker
                if ours:
                    left.append(proc)
        return left

    def close(self) -> None:
        """Release the notify socket."""
        self.notify.close()


def _matches(got: Any, want: Any) -> bool:
    if callable(want):
        return bool(want(got))
    if isinstance(want, (set, frozenset, tuple, list)):
        return got in want
    return bool(got == want)


def kill_all(procs: Iterable[psutil.Process]) -> None:
    """SIGCONT (a stopped process cannot die of SIGTERM) and SIGKILL each, then wait."""
    procs = list(procs)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGCONT)
            proc.kill()
    psutil.wait_procs(procs, timeout=10)


def describe(procs: Iterable[psutil.Process]) -> str:
    """pid and command line of each process, one per line."""
    return "\n".join(f"  pid {p.pid}: {cmdline(p)[:120]}" for p in procs)


def record_times(name: str, figures: Mapping[str, Any]) -> None:
    """Keep one scenario's measured times; the file is rewritten after each scenario."""
    TIMES[name] = dict(figures)
    doc = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "python": platform.python_version()},
        "note": "seconds; from vllmwatch's JSON log timestamps: fault -> restart.begin "
                "(detect_s) -> child.ready (recover_s); total_s = fault -> child.ready",
        "scenarios": TIMES,
    }
    TIMES_FILE.parent.mkdir(parents=True, exist_ok=True)
    TIMES_FILE.write_text(json.dumps(doc, indent=2) + "\n")
