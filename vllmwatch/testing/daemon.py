"""The one harness around a `vllmwatch run` process, for tests and benchmarks alike.

Shared by the daemon tests (fake vLLM), the end-to-end tests (real vLLM), bench/ and
bench/gpu/ (which runs on the GPU machine from an export of vllmwatch/ and bench/gpu/ only,
hence here, in the package tree, and not under tests/; the .deb leaves it out):
- the config is a dict written as TOML, or a file already written;
- a NOTIFY_SOCKET listener (AF_UNIX datagrams) records every message with its monotonic time;
- the daemon's JSON log lines on stderr are parsed into events by a reader thread, each with
  its monotonic arrival time; a hook sees every line (benchmarks timestamp them into a file);
- `wait_event` polls against a deadline, never a bare sleep;
- `stop()` ends the daemon (SIGTERM, wait, SIGKILL) and says how; `close()` also asserts that
  nothing of its tree is left (the VLLMWATCH_INSTANCE marker, or a `VLLM::`/fake_vllm cmdline
  on its port) and that the port is free.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
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

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from vllmwatch.shell.child import instance_id
from vllmwatch.testing.daemonenv import daemon_env
from vllmwatch.testing.leftovers import leftovers, wait_for_gone, wait_for_value
from vllmwatch.testing.notify import NotifyListener
from vllmwatch.testing.ports import port_free
from vllmwatch.testing.tomlfile import merge, to_toml
from vllmwatch.testing.waiting import FIRST_READY_S, TIMEOUT_SCALE, wait_for

PYTHON = sys.executable
Event = dict[str, Any]
# Called for every stderr line: (monotonic arrival time, the line, its event or None).
LineHook = Callable[[float, str, "Event | None"], None]


def run_argv(config_path: Path, vllmwatch: Iterable[str] = (PYTHON, "-m", "vllmwatch")
             ) -> list[str]:
    """`vllmwatch run` on config_path with JSON logs on stderr."""
    return [*vllmwatch, "run", "--config", str(config_path), "--log-format", "json"]


class Daemon:
    """One `vllmwatch run` subprocess with its config, notify listener and parsed events.

    workdir holds the config (a dict is written there as vllmwatch.toml; a Path is used as
    it is; None only with argv, for a stand-in that writes events like vllmwatch's). argv
    replaces the command (default: this Python's `-m vllmwatch run`);
    own_session starts it in a session of its own, so that stop() can kill its group;
    checkout_path puts the folder holding this vllmwatch first on its PYTHONPATH (not on the
    GPU machine, where that folder holds vLLM's packages too); armed=True passes the fake
    vLLM --arm-file, so that its --*-after faults count from arm() (after READY), not from
    its own ready (which races the daemon's READY on a loaded machine).
    """

    def __init__(self, workdir: Path, config: Mapping[str, Mapping[str, Any]] | Path | None,
                 env: Mapping[str, str] | None = None, notify: bool = True,
                 argv_prefix: Iterable[str] = (), argv: list[str] | None = None,
                 own_session: bool = False, on_line: LineHook | None = None,
                 checkout_path: bool = True, armed: bool = False) -> None:
        self.workdir = workdir
        self.config: dict[str, dict[str, Any]] = {}
        if config is None:
            assert argv is not None, "a Daemon without a config needs its argv"
            self.config_path = workdir / "vllmwatch.toml"
        elif isinstance(config, Path):
            self.config_path = config
            self.config = tomllib.loads(config.read_text())
        else:
            self.config = merge(config)
            self.config_path = workdir / "vllmwatch.toml"
            if armed:  # the fake vLLM's --*-after faults wait for arm(), not for seconds
                vllm = self.config.setdefault("vllm", {})
                vllm["extra_args"] = [*vllm.get("extra_args", []), "--arm-file",
                                      str(self.arm_file)]
            self.write_config(self.config)
        self.port = int(self.config.get("vllm", {}).get("port", 8000))
        self.status_listen = str(self.config.get("status", {}).get("listen", ""))
        self.marker = instance_id(str(self.config_path))
        self.notify = NotifyListener() if notify else None
        self.events: list[Event] = []
        self.arrived: list[float] = []  # monotonic arrival time of each event
        self._readies: list[int] = []  # READY=1 datagrams had when each event arrived
        self._marks: dict[int, int] = {}  # a mark -> READY=1 datagrams had when taken
        self.raw: list[str] = []  # stderr lines that were not JSON (tracebacks)
        self.proc: subprocess.Popen[bytes] | None = None
        self._env = daemon_env(env, self.notify, checkout_path)
        # The state directory (group file, incident records) of this daemon, not the host's.
        self._env.setdefault("STATE_DIRECTORY", str(workdir / "state"))
        self._argv = argv or [*argv_prefix, *run_argv(self.config_path)]
        self._own_session = own_session
        self._on_line = on_line
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self.started_mono = 0.0

    # ---- life cycle ----

    def write_config(self, config: Mapping[str, Mapping[str, Any]] | str) -> None:
        """(Re)write the config file: a dict as TOML, or raw text as is."""
        text = config if isinstance(config, str) else to_toml(config)
        self.config_path.write_text(text)

    def start(self) -> Daemon:
        """Launch the daemon with JSON logs on stderr."""
        self.started_mono = time.monotonic()
        self.proc = subprocess.Popen(self._argv, env=self._env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     cwd=str(self.workdir), start_new_session=self._own_session)
        self._reader = threading.Thread(target=self._read, name="daemon-stderr", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in iter(self.proc.stderr.readline, b""):
            now, readies = time.monotonic(), self._ready_count()
            line = raw.decode("utf-8", "replace").rstrip("\n")
            event = _parse(line)
            if self._on_line is not None:
                self._on_line(now, line, event)
            with self._lock:
                if event is None:
                    self.raw.append(line)
                else:
                    self.events.append(event)
                    self.arrived.append(now)
                    self._readies.append(readies)

    def _ready_count(self) -> int:
        return self.notify.count("READY=1") if self.notify is not None else 0

    @property
    def pid(self) -> int:
        """The daemon's pid."""
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        """Started and not yet exited."""
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> float:
        """Send a signal to the daemon; return the monotonic time it was sent (see at())."""
        assert self.proc is not None
        now = time.monotonic()
        self.proc.send_signal(sig)
        return now

    def wait_exit(self, timeout: float) -> int:
        """Wait for the daemon to exit and return its exit code (and let the reader finish)."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"daemon still running after {timeout:.1f}s\n"
                                 + self.dump()) from None
        if self._reader is not None:
            self._reader.join(5.0 * TIMEOUT_SCALE)
        return code

    def stop(self, timeout: float = 20.0 * TIMEOUT_SCALE) -> tuple[int | None, float | None]:
        """SIGTERM, wait up to timeout, then SIGKILL (its group with own_session): the exit
        code and the seconds it took to exit (None when it had exited already). The default
        scales (TIMEOUT_SCALE): callers assert on the exit code, which a SIGKILL that a loaded
        box's slow exit drew would turn into a failure."""
        if self.proc is None:
            return None, None
        took = None
        if self.proc.poll() is None:
            t = time.monotonic()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill()
            took = round(time.monotonic() - t, 2)
        if self._reader is not None:
            self._reader.join(5.0 * TIMEOUT_SCALE)
        return self.proc.returncode, took

    def _kill(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(OSError):
            if self._own_session:
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.kill()
        self.proc.wait(5 * TIMEOUT_SCALE)  # the reap after a SIGKILL: a loaded box is slow

    def close(self, check: bool = True) -> None:
        """stop(); then assert nothing of ours is left and the port is free."""
        try:
            self.stop()
            if check:
                left = wait_for_gone(lambda: self.leftovers(), 5.0)
                assert not left, f"left behind: {left}\n" + self.dump()
                assert wait_for_value(lambda: port_free(self.port), 5.0), \
                    f"port {self.port} still busy after the daemon exited"
        finally:
            for proc in self.leftovers():  # never leak into the next test, even on failure
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            if self.notify is not None:
                self.notify.close()

    def leftovers(self) -> list[psutil.Process]:
        """Live processes carrying our marker, or a vLLM/fake_vllm cmdline with our port."""
        return leftovers(self.marker, self.port)

    # ---- what the daemon said ----

    def named(self, name: str, since: int = 0, **fields: Any) -> list[Event]:
        """Events called `name` (from index `since`) whose fields match."""
        with self._lock:
            events = self.events[since:]
        return [e for e in events
                if e.get("event") == name and all(e.get(k) == v for k, v in fields.items())]

    def first(self, pred: Callable[[Event], bool], since: int = 0) -> int | None:
        """The index of the first event from `since` on that satisfies pred, or None."""
        with self._lock:
            events = self.events[since:]
        return next((since + k for k, e in enumerate(events) if pred(e)), None)

    def index(self, event: Event) -> int:
        """Where event (this very dict) stands in events: what came before it, what after."""
        with self._lock:
            return next(k for k, e in enumerate(self.events) if e is event)

    def at(self, event: Event) -> float:
        """When event's line arrived, on the test's monotonic clock (never its wall ts)."""
        return self.arrived[self.index(event)]

    def exited(self) -> bool:
        """The daemon exited and its reader has read everything it wrote."""
        return self.proc is not None and self.proc.poll() is not None and \
            (self._reader is None or not self._reader.is_alive())

    def wait_event(self, name: str, timeout: float, since: int = 0, **fields: Any) -> Event:
        """The first event called `name` (from index since) with matching fields."""
        def found() -> Event | None:
            gone = self.exited()  # before the look: once gone, every event has been read
            hits = self.named(name, since, **fields)
            if hits or not gone:
                return hits[0] if hits else None
            assert self.proc is not None
            raise AssertionError(f"daemon exited ({self.proc.returncode}) before "
                                 f"{name} {fields}\n" + self.dump())

        try:
            return wait_for(found, timeout, f"{name} {fields}")  # type: ignore[no-any-return]
        except AssertionError as exc:
            if "timed out" in str(exc):
                raise AssertionError(f"{exc}\n{self.dump()}") from None
            raise

    def mark(self) -> int:
        """An index into events: wait for things (and READY=1 datagrams) after this point."""
        readies = self._ready_count()  # before the index: a datagram between is not missed
        with self._lock:
            self._marks.setdefault(len(self.events), readies)
            return len(self.events)

    @property
    def arm_file(self) -> Path:
        """The fake vLLM's --arm-file (a Daemon made with armed=True)."""
        return self.workdir / "faults.arm"

    def arm(self) -> tuple[int, float]:
        """Start the fake's fault delays now: a mark taken before the touch (nothing the
        fault causes falls before it) and the monotonic time of the touch (see at())."""
        since, now = self.mark(), time.monotonic()
        self.arm_file.touch()
        return since, now

    def wait_ready(self, timeout: float = 30.0, since: int = 0) -> Event:
        """child.ready from since on, then (a listener) a READY=1 past the count at mark since
        (else at event since-1's arrival): counted, never timed. A first start (since 0) waits
        at least FIRST_READY_S (waiting.py says why)."""
        timeout = max(timeout, FIRST_READY_S) if since == 0 else timeout
        ev = self.wait_event("child.ready", timeout, since)
        if self.notify is not None:
            seen = self._marks.get(since, self._readies[since - 1] if since else 0)
            wait_for(lambda: self._ready_count() > seen, 2.0, "READY=1 datagram")
        return ev

    def states(self) -> list[str]:
        """The sequence of states entered so far."""
        return [str(e["to"]) for e in self.named("state.changed")]

    def dump(self, last: int = 40, own: int = 80) -> str:
        """The last child and raw lines, then vllmwatch's own events (the story: restarts and
        their reasons), for failure messages; a CI log keeps only the tail of a failure, so
        the story comes last, after the child's traceback."""
        with self._lock:
            events, raw = list(self.events), list(self.raw)
        kids = [e for e in events if e.get("event") == "child.line"]
        lines = [f"  child| {e.get('text', '')}"[:200] for e in kids[-last:]]
        lines += ["  raw| " + r for r in raw[-20:]]
        lines.append("  --- vllmwatch's own events ---")
        mine = [e for e in events if e.get("event") != "child.line"]
        lines += ["  " + json.dumps(dict(e))[:300] for e in mine[-own:]]
        tail = ", ".join(str(e.get("event")) for e in mine[-8:])  # a clipped CI log keeps this
        return f"daemon events (the last: {tail}; {len(kids)} child lines):\n" + "\n".join(lines)

    # ---- the status endpoint ----

    def http_get(self, path: str, timeout: float = 2.0 * TIMEOUT_SCALE) -> tuple[int, bytes]:
        """GET from the status endpoint: (status, body). The default deadline scales
        (TIMEOUT_SCALE): callers assert on the answer, and a loaded box can keep a daemon
        past 2 s from giving it (a timeout raises, failing the test)."""
        url = f"http://{self.status_listen}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read()


def _parse(line: str) -> Event | None:
    """A vllmwatch JSON event, or None for anything else (a traceback line)."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


def ts_of(event: Event) -> float:
    """Its wall-clock stamp, to report: order is Daemon.index(), time Daemon.at() (NTP)."""
    return float(event["ts"])
