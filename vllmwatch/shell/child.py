"""The child process: spawn in a new session, signal its group, reap, sweep what is left."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

import psutil

from vllmwatch.config.command import ChildCommand
from vllmwatch.config.redact import REDACT
from vllmwatch.core.events import ChildExited, SweepDone
from vllmwatch.core.policy import signal_name
from vllmwatch.incident.record import processes_now
from vllmwatch.logfn import LogFn
from vllmwatch.shell import groupfile, kin, ports
from vllmwatch.shell.groupfile import MARKER as MARKER  # re-exported: the env marker

if TYPE_CHECKING:
    from vllmwatch.core.actions import Sweep
    from vllmwatch.shell.reaper import Reaper

# How vLLM's processes look in a process list (FACTS: comm is truncated; match the cmdline).
_VLLM_SIGNS = ("VLLM::", "vllm serve", "vllm.entrypoints", "vllm.v1.engine")


def instance_id(config_path: str) -> str:
    """A stable id per config file, inherited by every process of our tree via MARKER."""
    return hashlib.sha256(os.path.abspath(config_path).encode()).hexdigest()[:16]


@dataclass
class Child:
    """A running child: its Popen, and a pidfd that becomes readable when it exits."""

    proc: subprocess.Popen[bytes]
    pidfd: int | None

    @property
    def pid(self) -> int:
        """The child's pid, which is also its process group id (new session)."""
        return self.proc.pid

    @property
    def stdout(self) -> IO[bytes]:
        """The child's stdout and stderr, merged."""
        assert self.proc.stdout is not None
        return self.proc.stdout

    def close(self) -> None:
        """Release the pidfd."""
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def spawn(cmd: ChildCommand, marker: str) -> Child:
    """Start the child in a new session (its own process group) with our marker in its env."""
    env = dict(cmd.env)
    env[MARKER] = marker
    with kin.control_signals_held():  # systemctl kill -s SIGUSR1: the daemon's, not vLLM's
        proc = subprocess.Popen(
            list(cmd.argv), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    pidfd = None
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(proc.pid)
    return Child(proc, pidfd)


def signal_group(pgid: int, signame: str) -> bool:
    """Signal a whole process group; False when nothing was there."""
    try:
        os.killpg(pgid, getattr(signal, signame))
    except (ProcessLookupError, PermissionError):
        return False
    return True


def reap(child: Child, last_lines: tuple[str, ...] = ()) -> ChildExited | None:
    """Collect the exit status if the child has exited; None while it runs."""
    code = child.proc.poll()
    if code is None:
        return None
    child.close()
    if code < 0:
        return ChildExited(child.pid, None, signal_name(-code), last_lines)
    return ChildExited(child.pid, code, None, last_lines)


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie: a zombie holds no memory and no port, it only waits for its
    parent (often PID 1, which may reap late) to collect it."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def _looks_like_vllm(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error, OSError):
        line = " ".join(proc.cmdline())
        return any(sign in line for sign in _VLLM_SIGNS)
    return False


def describe(proc: psutil.Process) -> str:
    """pid and command line, for logs."""
    with contextlib.suppress(psutil.Error):
        return f"pid {proc.pid} ({REDACT.head(' '.join(proc.cmdline()), 80) or proc.name()})"
    return f"pid {proc.pid}"


def describe_pid(pid: int | None) -> str:
    """'pid 123 (vllm serve ...)', tolerating vanished processes and ones we may not see."""
    if pid is None:
        return "a process not visible to this user (another user's?)"
    try:
        return describe(psutil.Process(pid))
    except psutil.Error:
        return f"pid {pid}"


# vLLM binds its ZMQ IPC sockets at `ipc://$TMPDIR/<uuid4>`; a Unix socket path holds at most
# 107 bytes (sun_path), and vLLM's start fails past it ("ipc path ... is longer than 107
# characters"). A TMPDIR that leaves no room for the 37 bytes of "/<uuid4>" is made under
# /tmp instead (seen with a long $TMPDIR: a test's tmp_path, a deep home directory).
IPC_PATH_MAX = 107
_IPC_NAME = 37
FALLBACK_TMP = "/tmp"


def short_tmpdir(prefix: str) -> str:
    """mkdtemp(prefix) where vLLM's IPC socket paths inside it fit, else under /tmp."""
    path = tempfile.mkdtemp(prefix=prefix)
    if len(os.fsencode(path)) + _IPC_NAME <= IPC_PATH_MAX:
        return path
    os.rmdir(path)
    return tempfile.mkdtemp(prefix=prefix, dir=FALLBACK_TMP)


def child_tmpdir(marker: str) -> str:
    """A fresh TMPDIR for one child generation: vLLM leaves its ZMQ IPC socket files in the
    temp directory when it is killed; a directory of its own is removed after the sweep."""
    return short_tmpdir(f"vllmwatch-{marker}-")


def remove_tmpdirs(marker: str) -> None:
    """Remove the TMPDIRs of our earlier children (call only when none of them is alive)."""
    for base in dict.fromkeys((tempfile.gettempdir(), FALLBACK_TMP)):
        for path in glob.glob(os.path.join(base, f"vllmwatch-{marker}-*")):
            shutil.rmtree(path, ignore_errors=True)


remember_group = groupfile.remember  # record (or with None, forget) the child's group


def remembered_group(marker: str, log: LogFn | None = None) -> int | None:
    """The group an earlier vllmwatch of this instance left running, when provably ours."""
    got = groupfile.read(marker)
    if got is None:
        return None
    why = groupfile.proven(got)
    if why is None:
        return got.pgid
    if log is not None:
        log("warning", "child.group_unproven", pgid=got.pgid, reason=why,
            detail="only its vLLM processes of our user started after it are swept"
            if why == groupfile.LEADER_GONE else "the remembered process group is left alone")
    return None


def _ids(pid: int) -> tuple[int, int]:
    try:
        return os.getpgid(pid), os.getsid(pid)
    except OSError:
        return -1, -1


def find_tree(pgid: int | None, marker: str, log: LogFn | None = None,
              exempt: frozenset[int] = frozenset(), adopt: bool = False
              ) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """Our processes and vLLM-looking foreign ones.

    Ours: the child's group, anything of our user carrying our marker, and anything in the
    group or session of such a process. vLLM's process titles (VLLM::EngineCore) overwrite
    the environment block, so orphaned engines lose the marker; they keep the session of
    the child, which we started with setsid and vLLM never leaves. A group remembered from
    an earlier vllmwatch counts only when provably ours (see groupfile). With `adopt` (we are
    the subreaper) also what we adopted and, always, every descendant of what is ours: a
    descendant that called setsid and cleared its environment (shell/kin.py). `exempt`:
    pids that are ours but no child's (the standby), left out by pid, never by their shape.
    A tree that descends from another live vllmwatch is that daemon's: never ours.
    """
    me = os.getpid()
    skip = exempt | kin.me_and_ancestors(me)  # never our own line (a shell with the marker)
    procs = [(p, *_ids(p.pid)) for p in processes_now()  # (not process_iter: its cache)
             if p.pid not in skip and _alive(p)]
    marked = {p.pid for p, _, _ in procs if groupfile.carries_marker(p, marker)}
    groups = {g for p, g, _ in procs if p.pid in marked and g > 0}
    if pgid is not None:
        groups.add(pgid)
    old = remembered_group(marker, log) if pgid is None else None
    if old is not None:
        groups.add(old)
    gone = groupfile.leaderless(marker) if pgid is None and old is None else None
    took = kin.adopted(((p, sid) for p, _, sid in procs), me, os.getsid(0)) if adopt else set()
    ours: list[psutil.Process] = []
    rest: list[psutil.Process] = []
    for proc, group, session in procs:
        mine = group in groups or session in groups or proc.pid in marked or proc.pid in took \
            or (gone is not None and _looks_like_vllm(proc)
                and groupfile.orphan_of(gone, proc, group, session))
        ours_now = mine and (proc.pid in took or kin.owning_daemon(proc, me) is None)
        (ours if ours_now else rest).append(proc)
    ours = kin.with_descendants(ours, skip)
    # Last: the record reaches past group, session, marker and descent (a setsid'd process
    # reparented to init), and names only what no other rule took.
    known = groupfile.recognised(rest, {p.pid for p in ours}, marker, me, log)
    foreign = [p for p in rest if p not in known and _looks_like_vllm(p)]
    return kin.with_descendants(ours + known, skip), foreign


def port_holder(host: str, port: int, ignore: set[int]) -> str | None:
    """Who listens where vLLM will bind, or None when it is free (the rule: shell/ports.py)."""
    found = ports.holders(host, port, ignore)
    if not found:
        return None
    first = found[0]
    if first.pid is None:
        return f"an unknown process on {first.address} (not visible to this user)"
    return describe_pid(first.pid)


def _wait_gone(procs: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    """Wait until the processes are gone; the ones still alive. Not psutil.wait_procs: it
    counts a zombie as alive until someone reaps it."""
    deadline = time.monotonic() + seconds
    alive = [p for p in procs if _alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _alive(p)]
    return alive


def sweep(pgid: int | None, marker: str, host: str, port: int, grace: float = 5.0,
          settle: float = 0.0, log: LogFn | None = None, exempt: frozenset[int] = frozenset(),
          adopt: bool = False, pass_on: float = 0.0) -> SweepDone:
    """Kill everything left of our tree and check the port; bounded by a few seconds.

    `settle`: after a stop we asked for, vLLM's engine and workers are still exiting on
    their own when the API server is gone; give them that long before calling them leftovers.
    `pass_on`: the leader alone got the stop's SIGTERM; what outlived it in its group gets it
    and this long (passon.py).
    """
    ours, foreign = find_tree(pgid, marker, log, exempt, adopt)
    # Read now: the port wait below can take `grace` seconds, and a process that ends in
    # between would be named by its pid alone.
    foreign_what = tuple(describe(p) for p in foreign)
    group = [p for p in ours if _ids(p.pid)[0] == pgid] if pass_on > 0 else []
    if group:  # the leader's group outlived it: a wrapper's vLLM (passon.py, imported then);
        from vllmwatch.shell import passon  # past its window (stop_timeout): no more settle
        settle = 0.0 if passon.wait(group, pass_on, log, _alive, settle) else settle
    stragglers = _wait_gone(ours, settle)
    what = dict(zip(stragglers, kin.describe_all(stragglers), strict=True))  # while alive
    for proc in stragglers:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    alive = _wait_gone(stragglers, grace)
    killed = tuple(p.pid for p in stragglers if p not in alive)
    if not alive:
        remember_group(marker, None)
    holder = None
    deadline = time.monotonic() + grace
    while True:  # the kernel may need a moment to release a dead listener's socket
        holder = port_holder(host, port, ignore=set())
        if holder is None or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    return SweepDone(killed=killed, remaining=tuple(p.pid for p in alive), port_holder=holder,
                     foreign_vllm=foreign_what, seen=tuple(p.pid for p in ours),
                     killed_what=tuple(what[p] for p in stragglers if p not in alive))


def spare_marker(instance: str) -> str:
    """The spare engine's marker: never equal to the serving tree's (the sweeps tell them
    apart; its group file and tmpdirs are its own)."""
    return f"{instance}:spare"


def sweep_spare_leftovers(instance: str, log: LogFn, kill: bool,
                          exempt: frozenset[int] = frozenset()) -> tuple[int, ...]:
    """At the daemon's start: a spare engine left by a vllmwatch that was killed (SIGKILL,
    OOM) holds GPU memory and its socket; the serving tree's sweep does not know its marker.
    Killed when `kill` (restart.kill_stale), else named. Returns the pids killed."""
    marker = spare_marker(instance)
    ours, _ = find_tree(None, marker, log, exempt)
    if not ours:
        return ()
    what = kin.describe_all(ours)
    if not kill:
        log("warning", "spare.leftovers", pids=[p.pid for p in ours], what=list(what),
            killed=False, hint="restart.kill_stale = false: stop them yourself (they hold "
                               "GPU memory a new spare needs)")
        return ()
    for proc in ours:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    alive = _wait_gone(ours, 5.0)
    if not alive:
        remember_group(marker, None)
        remove_tmpdirs(marker)
    killed = tuple(p.pid for p in ours if p not in alive)
    log("warning" if not alive else "error", "spare.leftovers", pids=[p.pid for p in ours],
        what=list(what), killed=True, remaining=[p.pid for p in alive],
        detail="a spare engine of an earlier vllmwatch of this config (killed before it "
               "could stop it)")
    return killed


def sweep_or_look(action: Sweep, marker: str, log: LogFn, exempt: frozenset[int],
                  reaper: Reaper | None) -> SweepDone:
    """The core's Sweep: kill leftovers of our tree and check the port; at start (no group)
    honour kill_stale, and without it only look and say what is there."""
    if action.pgid is not None or action.kill_stale:
        # As subreaper every orphan of the tree comes to us: what we adopted is ours.
        done = sweep(action.pgid, marker, action.host, action.port, settle=action.settle,
                     log=log, exempt=exempt, adopt=reaper is not None, pass_on=action.pass_on)
        if reaper is not None:
            reaper.killed(done.killed)
        if not done.remaining:
            remove_tmpdirs(marker)
        return done
    ours, foreign = find_tree(action.pgid, marker, log, exempt, reaper is not None)
    holder = port_holder(action.host, action.port, ignore=set())
    return SweepDone((), tuple(p.pid for p in ours), holder,
                     tuple(describe(p) for p in foreign))
