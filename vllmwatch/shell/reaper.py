"""Reap orphans: as PID 1 of a container (or a child subreaper) every orphan becomes ours.

An API server killed with SIGKILL leaves EngineCore and its workers behind; they are
reparented to us and, when they die, stay zombies until we wait for them. The loop reaps its
own vLLM child through Popen, so this must never take that exit status (nor one that a
subprocess.Popen elsewhere in vllmwatch is about to wait for): it peeks with WNOWAIT, then
waits only for zombie children it can tell are not ours by pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from vllmwatch.logfn import LogFn

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
GRACE_S = 30.0  # how long a child we may have started keeps its zombie for its own waiter


@dataclass(frozen=True)
class Zombie:
    """A zombie child of ours as /proc shows it."""

    pid: int
    session: int
    name: str


def wanted(environ: Mapping[str, str], pid: int) -> bool:
    """Reap orphans always as PID 1 (a container), and by default elsewhere too:
    VLLMWATCH_SUBREAPER=0 turns it off.

    Why by default: an orphaned engine or resource tracker that dies after the sweep would
    otherwise be reparented to init, and in a container whose init does not reap it stays a
    zombie in the process table (seen on the H200 machine: 4 stops of 6 left one behind).
    """
    if pid == 1:
        return True
    return environ.get("VLLMWATCH_SUBREAPER", "1").lower() not in ("0", "false", "no")


def become_subreaper() -> bool:
    """prctl(PR_SET_CHILD_SUBREAPER, 1): orphans of our tree come to us, not to init."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def parse_stat(text: str) -> tuple[int, str, str, int, int]:
    """(pid, comm, state, ppid, session) from a /proc/PID/stat line (comm may hold spaces)."""
    head, _, tail = text.rpartition(")")
    pid_text, _, comm = head.partition(" (")
    fields = tail.split()
    return int(pid_text), comm, fields[0], int(fields[1]), int(fields[3])


def zombie_children(me: int, proc: str = "/proc") -> list[Zombie]:
    """Our children that have exited and wait to be reaped."""
    out = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/stat") as f:
                pid, comm, state, ppid, session = parse_stat(f.read())
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or unreadable
        if state == "Z" and ppid == me:
            out.append(Zombie(pid, session, comm))
    return out


def anything_waitable() -> bool:
    """Peek (WNOWAIT): is any child waiting to be reaped? Takes no exit status."""
    try:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return info is not None and info.si_pid != 0


class Reaper:
    """Reap orphaned zombies; call `reap(keep)` on every loop turn (SIGCHLD wakes the loop).

    `keep`: the pids the loop waits for itself (the current vLLM child). Cheap when there is
    nothing to reap: one waitid() peek.
    """

    def __init__(self, log: LogFn, clock: Callable[[], float] = time.monotonic,
                 me: int | None = None, grace: float = GRACE_S) -> None:
        self._log, self._clock, self._grace = log, clock, grace
        self._me = os.getpid() if me is None else me
        self._session = os.getsid(0)
        self._seen: dict[int, float] = {}
        self._killed: set[int] = set()  # leftovers the sweep killed: nobody else waits
        self._lock = threading.Lock()

    def killed(self, pids: Collection[int]) -> None:
        """The sweep killed these (from a worker thread): reap them without the grace that
        protects a child some Popen of ours waits for (a setsid'd leftover looks like one)."""
        waiting = {z.pid for z in zombie_children(self._me)}  # a zombie's pid is not reused
        with self._lock:
            self._killed |= set(pids) & waiting

    def _maybe_ours(self, z: Zombie) -> bool:
        # Started by us: in our session (subprocess.run), or a session leader
        # (start_new_session=True). An orphan of the vLLM tree is in the vLLM child's session.
        return z.session == self._session or z.session == z.pid

    def reap(self, keep: Collection[int] = ()) -> list[tuple[int, int]]:
        """Wait for every zombie child that is not in `keep`; [(pid, exit code)]."""
        if not anything_waitable():
            return []
        now = self._clock()
        reaped = []
        zombies = zombie_children(self._me)
        with self._lock:
            self._killed &= {z.pid for z in zombies}
            killed = set(self._killed)
        self._seen = {z.pid: self._seen.get(z.pid, now) for z in zombies}
        for z in zombies:
            if z.pid in keep:
                continue
            if z.pid not in killed and self._maybe_ours(z) and \
                    now - self._seen[z.pid] < self._grace:
                continue  # its Popen will wait for it; if nobody does, a later call reaps it
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(z.pid, os.WNOHANG)
                if pid:
                    code = os.waitstatus_to_exitcode(status)
                    reaped.append((pid, code))
                    self._log("info", "reaper.reaped", pid=pid, name=z.name, code=code)
        return reaped


def start(environ: Mapping[str, str], log: LogFn) -> Reaper | None:
    """A Reaper when wanted (PID 1 or asked), after becoming the child subreaper."""
    if not wanted(environ, os.getpid()):
        return None
    if os.getpid() != 1 and not become_subreaper():
        log("warning", "reaper.subreaper_failed",
            detail="orphans of vLLM go to init; run as PID 1 or on Linux >= 3.4")
    log("info", "reaper.on", pid=os.getpid())
    return Reaper(log)
