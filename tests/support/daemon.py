"""Run the real `vllmwatch run` daemon as a subprocess for tests, and watch what it does.

Shared by the daemon tests (fake vLLM), the end-to-end tests (real vLLM) and bench/:
- the config is a dict written as TOML;
- a NOTIFY_SOCKET listener (AF_UNIX datagrams in the test's tmp dir) records every message
  with its wall-clock time;
- the daemon's JSON log lines on stderr are parsed into events by a reader thread;
- `wait_for`/`wait_event` poll conditions against a deadline, never a bare sleep;
- `close()` stops the daemon (SIGTERM, wait, SIGKILL) and asserts that nothing of its tree
  is left (the VLLMWATCH_INSTANCE marker, or a `VLLM::`/fake_vllm cmdline on its port) and
  that the port is free.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil

from tests.support.ports import port_free
from tests.support.tomlfile import merge, to_toml
from tests.support.waiting import holds_within, wait_for
from vllmwatch.shell.child import MARKER, instance_id

PYTHON = sys.executable
REPO = Path(__file__).resolve().parents[2]
Event = dict[str, Any]
# The fake vLLM as the daemon's command, quick to start.
FAKE = [PYTHON, "-m", "vllmwatch.testing.fake_vllm", "--startup-seconds", "0.3"]


def base_config(port: int, status_port: int, fake_args: list[str] | None = None
                ) -> dict[str, dict[str, Any]]:
    """The daemon over the fake vLLM with short intervals everywhere, so that each fault
    shows within a second or two."""
    return {
        "vllm": {"command": FAKE, "model": "tiny", "port": port, "gpus": [],
                 "extra_args": fake_args or []},
        "probe": {"interval": "0.5s", "timeout": "1s", "canary_interval": "1s",
                  "canary_timeout": "1s", "metrics_interval": "0.5s"},
        "restart": {"backoff_initial": "0.2s", "backoff_max": "1s", "drain_timeout": "2s",
                    "stop_timeout": "3s"},
        "prewarm": {"enabled": False},
        "status": {"listen": f"127.0.0.1:{status_port}"},
    }


class NotifyListener:
    """A NOTIFY_SOCKET stand-in: records (wall time, message) for every datagram."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="notify-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.append((time.time(), data.decode("utf-8", "replace")))

    def lines(self) -> list[tuple[float, str]]:
        """Every NAME=value line received, each with its datagram's time."""
        return [(t, line) for t, msg in list(self.messages) for line in msg.split("\n") if line]

    def with_prefix(self, prefix: str) -> list[tuple[float, str]]:
        """The lines that start with prefix (e.g. "READY=1", "STATUS=")."""
        return [(t, line) for t, line in self.lines() if line.startswith(prefix)]

    def close(self) -> None:
        """Stop listening and remove the socket file."""
        self._stop = True
        self._thread.join(1.0)
        self.sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class Daemon:
    """One `vllmwatch run` subprocess with its config, notify listener and parsed events."""

    def __init__(self, workdir: Path, config: Mapping[str, Mapping[str, Any]],
                 env: Mapping[str, str] | None = None, notify: bool = True,
                 argv_prefix: Iterable[str] = ()) -> None:
        self.workdir = workdir
        self.config = merge(config)
        self.config_path = workdir / "vllmwatch.toml"
        self.write_config(self.config)
        self.port = int(self.config["vllm"]["port"])
        self.status_listen = str(self.config.get("status", {}).get("listen", ""))
        self.marker = instance_id(str(self.config_path))
        # AF_UNIX paths are limited to 108 bytes: pytest's tmp dirs can be longer.
        self._sockdir = Path(tempfile.mkdtemp(prefix="vwn-"))
        self.notify = NotifyListener(self._sockdir / "notify") if notify else None
        self.events: list[Event] = []
        self.raw: list[str] = []  # stderr lines that were not JSON (tracebacks)
        self.proc: subprocess.Popen[bytes] | None = None
        self._env = dict(os.environ if env is None else env)
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM"):
            self._env.pop(name, None)
        if env is not None:
            self._env.update(env)
        # The state directory (group file, incident records) of this test, not the host's.
        self._env.setdefault("STATE_DIRECTORY", str(workdir / "state"))
        if self.notify is not None:
            self._env["NOTIFY_SOCKET"] = self.notify.path
        self._env["PYTHONPATH"] = str(REPO) + os.pathsep + self._env.get("PYTHONPATH", "")
        self._argv_prefix = list(argv_prefix)
        self._reader: threading.Thread | None = None
        self.started_at = 0.0

    # ---- life cycle ----

    def write_config(self, config: Mapping[str, Mapping[str, Any]] | str) -> None:
        """(Re)write the config file: a dict as TOML, or raw text as is."""
        text = config if isinstance(config, str) else to_toml(config)
        self.config_path.write_text(text)

    def start(self) -> Daemon:
        """Launch the daemon with JSON logs on stderr."""
        argv = [*self._argv_prefix, PYTHON, "-m", "vllmwatch", "run", "--config",
                str(self.config_path), "--log-format", "json"]
        self.started_at = time.time()
        self.proc = subprocess.Popen(argv, env=self._env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     cwd=str(self.workdir))
        self._reader = threading.Thread(target=self._read, name="daemon-stderr", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in iter(self.proc.stderr.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            try:
                event = json.loads(line)
            except ValueError:
                self.raw.append(line)
                continue
            if isinstance(event, dict) and "event" in event:
                self.events.append(event)
            else:
                self.raw.append(line)

    @property
    def pid(self) -> int:
        """The daemon's pid."""
        assert self.proc is not None
        return self.proc.pid

    def signal(self, sig: int) -> float:
        """Send a signal to the daemon; return the wall time it was sent."""
        assert self.proc is not None
        now = time.time()
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
            self._reader.join(5.0)
        return code

    def close(self, check: bool = True) -> None:
        """SIGTERM, wait, SIGKILL; then assert nothing of ours is left and the port is free."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(20)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
            if self._reader is not None:
                self._reader.join(5.0)
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
            with contextlib.suppress(OSError):
                self._sockdir.rmdir()

    def leftovers(self) -> list[psutil.Process]:
        """Live processes carrying our marker, or a vLLM/fake_vllm cmdline with our port."""
        found = []
        me = os.getpid()
        port_flag = str(self.port)
        for proc in psutil.process_iter():
            if proc.pid == me:
                continue
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue  # dead; only waits for its parent (or PID 1) to reap it
                cmd = proc.cmdline()
                ours = False
                with contextlib.suppress(psutil.AccessDenied):
                    ours = proc.environ().get(MARKER) == self.marker
                looks = any("VLLM::" in a or "fake_vllm" in a for a in cmd) and \
                    port_flag in cmd
                if ours or looks:
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    # ---- what the daemon said ----

    def named(self, name: str, since: int = 0, **fields: Any) -> list[Event]:
        """Events called `name` (from index `since`) whose fields match."""
        return [e for e in self.events[since:]
                if e.get("event") == name and all(e.get(k) == v for k, v in fields.items())]

    def wait_event(self, name: str, timeout: float, since: int = 0, **fields: Any) -> Event:
        """The first event called `name` (from index since) with matching fields."""
        def found() -> Event | None:
            hits = self.named(name, since, **fields)
            if hits:
                return hits[0]
            if self.proc is not None and self.proc.poll() is not None and \
                    (self._reader is None or not self._reader.is_alive()):
                hits = self.named(name, since, **fields)
                if not hits:
                    raise AssertionError(f"daemon exited ({self.proc.returncode}) before "
                                         f"{name} {fields}\n" + self.dump())
                return hits[0]
            return None

        try:
            return wait_for(found, timeout, f"{name} {fields}")  # type: ignore[no-any-return]
        except AssertionError as exc:
            if "timed out" in str(exc):
                raise AssertionError(f"{exc}\n{self.dump()}") from None
            raise

    def mark(self) -> int:
        """An index into events: wait for things that happen after this point."""
        return len(self.events)

    def wait_ready(self, timeout: float = 10.0, since: int = 0) -> Event:
        """Wait for child.ready (and, with a notify listener, the READY=1 datagram)."""
        ev = self.wait_event("child.ready", timeout, since)
        if self.notify is not None:
            wait_for(lambda: any(t >= ev["ts"] - 0.001 for t, _ in
                                 self.notify.with_prefix("READY=1")),  # type: ignore[union-attr]
                     2.0, "READY=1 datagram")
        return ev

    def states(self) -> list[str]:
        """The sequence of states entered so far."""
        return [str(e["to"]) for e in self.named("state.changed")]

    def dump(self, last: int = 40, own: int = 80) -> str:
        """The last child and raw lines, then vllmwatch's own events (the story: restarts and
        their reasons), for failure messages; a CI log keeps only the tail of a failure, so
        the story comes last, after the child's traceback."""
        kids = [e for e in self.events if e.get("event") == "child.line"]
        lines = [f"  child| {e.get('text', '')}"[:200] for e in kids[-last:]]
        lines += ["  raw| " + r for r in self.raw[-20:]]
        lines.append("  --- vllmwatch's own events ---")
        mine = [e for e in self.events if e.get("event") != "child.line"]
        lines += ["  " + json.dumps(dict(e))[:300] for e in mine[-own:]]
        return "daemon events:\n" + "\n".join(lines)

    # ---- the status endpoint ----

    def http_get(self, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
        """GET from the status endpoint: (status, body)."""
        url = f"http://{self.status_listen}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read()


def wait_for_gone(get: Callable[[], list[psutil.Process]], timeout: float
                  ) -> list[psutil.Process]:
    """Poll get() until it is empty or timeout; return what is still there."""
    holds_within(lambda: not get(), timeout)
    return get()


def wait_for_value(pred: Callable[[], bool], timeout: float) -> bool:
    """Poll pred() until True or timeout; return whether it held."""
    return holds_within(pred, timeout)


def ts_of(event: Event) -> float:
    """An event's wall-clock timestamp."""
    return float(event["ts"])
