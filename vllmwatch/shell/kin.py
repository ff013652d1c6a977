"""Kinship of processes for the leftover sweep: what vllmwatch adopted, what descends from
its tree, and which trees belong to another live vllmwatch.

A vLLM descendant that calls setsid and clears its environment leaves both the child's
session and our marker, so the session and marker rules of child.find_tree miss it. Two facts
still tie it to us: while its parent lives it descends from our tree, and once its parent is
gone it is reparented to us (vllmwatch is the child subreaper, shell/reaper.py). Processes we
start ourselves for our own use are told apart: helpers run in our session (subprocess.run)
and the standby is exempt by pid (the launcher's `exempt()`), never by shape.

Also here: when a process started, in ticks since boot (its identity beside the pid); and
the daemon's control signals held back from the trees it starts (control_signals_held).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Collection, Iterable, Iterator

import psutil

from vllmwatch.config.redact import REDACT


def _ppid(proc: psutil.Process) -> int:
    try:
        return int(proc.ppid())
    except psutil.Error:
        return -1


def adopted(procs: Iterable[tuple[psutil.Process, int]], me: int, my_session: int
            ) -> set[int]:
    """Pids of our direct children that are outside our session: adopted orphans (or a
    child started in a new session, which the caller exempts by pid). `procs`: (process,
    its session id)."""
    return {p.pid for p, session in procs if session != my_session and _ppid(p) == me}


def is_vllmwatch_daemon(proc: psutil.Process) -> bool:
    """`vllmwatch run` (the console script or `python -m vllmwatch run`)."""
    with contextlib.suppress(psutil.Error, OSError):
        args = proc.cmdline()
        return "run" in args and any(os.path.basename(a) == "vllmwatch" for a in args)
    return False


def owning_daemon(proc: psutil.Process, me: int) -> int | None:
    """The pid of another live vllmwatch this process descends from (its tree is that
    daemon's, never our leftover); None when it descends from us or from no vllmwatch."""
    try:
        parents = proc.parents()
    except psutil.Error:
        return None
    for parent in parents:
        if parent.pid == me:
            return None
        if is_vllmwatch_daemon(parent):
            return parent.pid
    return None


def me_and_ancestors(me: int) -> frozenset[int]:
    """Our pid and our ancestors': whatever they carry, a sweep never kills its own line."""
    try:
        return frozenset({me, *(p.pid for p in psutil.Process(me).parents())})
    except psutil.Error:
        return frozenset({me})


def with_descendants(procs: list[psutil.Process], skip: Collection[int]
                     ) -> list[psutil.Process]:
    """procs and every live descendant of theirs (a setsid'd grandchild whose parent still
    runs), without the pids in `skip`."""
    seen = {p.pid for p in procs}
    out = list(procs)
    for proc in procs:
        try:
            kids = proc.children(recursive=True)
        except psutil.Error:
            continue
        for kid in kids:
            if kid.pid not in seen and kid.pid not in skip:
                seen.add(kid.pid)
                out.append(kid)
    return out


def tree_pids(root_pid: int | None) -> tuple[int, ...]:
    """The root and all its descendants that exist now; () when the root is gone (reaped).

    A root that exited and is not reaped yet (a zombie) still owns its tree: at its exit its
    children were reparented (to us, the subreaper, or to init), so `children()` finds none
    and the engines that still hold the GPU would drop out of the tree's figure. They keep
    the session and group the root leads (vLLM's child is started with setsid; its pid cannot
    be reused while it is a zombie), so that is where they are found, with their descendants.
    """
    if root_pid is None:
        return ()
    try:
        root = psutil.Process(root_pid)
        kids = root.children(recursive=True)
        if root.status() == psutil.STATUS_ZOMBIE:
            kids = with_descendants(_led_by(root_pid), {root_pid})
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ()
    return (root_pid, *(k.pid for k in kids))


def _led_by(leader: int) -> list[psutil.Process]:
    """The processes in the session or process group `leader` leads (not itself)."""
    out = []
    for pid in psutil.pids():
        try:
            if pid != leader and leader in (os.getsid(pid), os.getpgid(pid)):
                out.append(psutil.Process(pid))
        except (OSError, psutil.Error):
            continue  # gone meanwhile
    return out


def describe_all(procs: Iterable[psutil.Process]) -> list[str]:
    """'pid N (cmdline)' for each, read while they are alive (a dead one has no cmdline)."""
    out = []
    for proc in procs:
        try:
            line = REDACT.head(" ".join(proc.cmdline()), 120) or proc.name()
        except psutil.Error:
            line = "?"
        out.append(f"pid {proc.pid} ({line})")
    return out


# --- when a process started, in a clock that no wall-clock step moves ----------------------
#
# psutil's `create_time()` is the start in clock ticks since boot plus the boot time of
# /proc/stat, and the kernel derives that boot time from the wall clock: an NTP step (a VM
# resynced after a pause) moves the create_time of every process by the step. A create_time
# read before a step never equals one read after it, so every engine of a healthy vLLM looked
# dead (CI, 2026-12-04: after a 27 s step the start skipped /health until
# startup.stall_timeout restarted it). The ticks since boot never change for a process:
# identity ("still the process seen") and order ("started after") are judged on them.

_TICKS = os.sysconf("SC_CLK_TCK")


def start_stat(pid: int) -> tuple[str, float] | None:
    """(state letter, seconds after boot at which it started) from /proc/PID/stat; None
    when there is no such process. Fields 3 and 22: after the last ')' (a title may hold
    one), the state comes first and the start time 19 fields later."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rpartition(b")")[2].split()
        return fields[0].decode(), int(fields[19]) / _TICKS
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None


def started(pid: int) -> float | None:
    """Seconds after boot at which `pid` started; None when there is no such process."""
    got = start_stat(pid)
    return got[1] if got is not None else None


def boot_id() -> str:
    """This boot's id: a start time since boot means nothing after a reboot."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


# --- signalling the process a pid named when it was judged, never its successor -------------
#
# A check (its start time, its SigCgt) and then os.kill(pid) leave a window in which the pid
# may be reaped and reused: the signal then reaches a stranger. A pidfd opened before the
# check names one process for good: if that process is gone by the signal, the signal fails
# (ESRCH) instead of reaching whoever got the pid since.


@contextlib.contextmanager
def pinned(pid: int) -> Iterator[Callable[[int], None] | None]:
    """A sender bound to the process `pid` names now (None: there is none). Judge the
    process inside the block, then send: the signal reaches that process or no one. Without
    pidfd_open (Linux < 5.3) it falls back to os.kill."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        yield None
        return
    except (OSError, AttributeError):
        yield lambda sig: os.kill(pid, sig)
        return
    try:
        yield lambda sig: signal.pidfd_send_signal(fd, sig)
    finally:
        os.close(fd)


def signal_same(pid: int, created: float, sig: int) -> bool:
    """Send `sig` to `pid` if it is still the process that started at `created` (seconds
    after boot, `started()`); True when sent."""
    with pinned(pid) as send:
        if send is None or started(pid) != created:
            return False
        try:
            send(sig)
        except OSError:
            return False
        return True


# SIGHUP (reload) and SIGUSR1 (graceful restart) are the daemon's. `systemctl kill -s SIGUSR1
# vllmwatch` (every process of the unit, systemctl's default) also reached vLLM, whose Python
# dies of it: vLLM killed outright, its requests failed, instead of the drained restart asked
# for (measured under systemd 252). A blocked signal stays blocked across fork and exec, in
# every process and thread the child starts (vLLM's spawned EngineCore and workers), and is
# never delivered there; vLLM itself handles neither. SIGTERM stays: a stop.
CONTROL_SIGNALS = frozenset({signal.SIGHUP, signal.SIGUSR1})


@contextlib.contextmanager
def control_signals_held() -> Iterator[None]:
    """Around a Popen of a vLLM tree: its processes start with CONTROL_SIGNALS blocked. Only
    this thread's mask changes meanwhile; the daemon's own signals reach another thread."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, CONTROL_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
