"""The remembered process group of the live child, for a vllmwatch that was killed; and the
instance lock against one still alive (acquire_lock, at the end): both live in the private
state directory, one file each per instance.

It steers what we kill at the next start, so it is trusted only when provably ours:
- it lives where only the daemon's user can write ($STATE_DIRECTORY, $RUNTIME_DIRECTORY, or
  a private 0700 directory we create and verify), never under a predictable /tmp name;
- the file itself is ours and writable by nobody else, and not a link;
- the recorded leader still runs with the recorded start time (pids recycle), or it still
  carries this instance's environment marker. vLLM's process titles erase the environment
  of EngineCore/Worker, but not of the leader we spawned, which is the one asked.
- the tree's members the daemon saw (each memory sample), each by its pid and its start time
  since boot: a process that runs now with that pid, that start and our user is the one we
  saw in our tree (a pid is reused only by a process that starts later). It is how a
  descendant that left the group, the session and the marker (setsid, a cleared environment)
  is known after the daemon was SIGKILLed with the leader gone: nothing else ties it to us.
Anything else is logged by the caller and left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

import psutil

from vllmwatch.config import safefile
from vllmwatch.config.safefile import state_dir as state_dir  # the rule lives there (prewarm/)
from vllmwatch.config.safefile import state_dir_candidate as state_dir_candidate
from vllmwatch.logfn import LogFn
from vllmwatch.shell import kin

MARKER = "VLLMWATCH_INSTANCE"
_START_SLACK_S = 0.05  # create_time is boot time + jiffies: equal when it is the same process
MEMBERS_MAX = 256  # members remembered per tree (a tree of vLLM is a few dozen processes)
_WRITE = threading.Lock()  # the launch (loop) and the memory sample (a worker) write the file


@dataclass(frozen=True)
class Remembered:
    """What the file says: the child's group (its leader's pid) and the leader's start time:
    `started` on the wall clock (what earlier builds wrote), `since_boot` in the clock no
    wall-clock step moves (shell/kin.py), valid for the boot `boot_id` only."""

    pgid: int
    started: float
    marker: str
    since_boot: float | None = None
    boot_id: str = ""
    members: tuple[tuple[int, float], ...] = ()  # (pid, its start since boot) seen in the tree

    def start_of(self, pid: int) -> tuple[float, float] | None:
        """(pid's start, the leader's) in the best clock both have; None if pid is gone."""
        if self.since_boot is not None and self.boot_id and self.boot_id == kin.boot_id():
            mine = kin.started(pid)
            return None if mine is None else (mine, self.since_boot)
        try:  # a file of an earlier build: the wall clock is all it has
            return psutil.Process(pid).create_time(), self.started
        except psutil.Error:
            return None


def path_of(marker: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The group file of this instance, or None when there is no trusted place for it."""
    directory = state_dir(environ)
    return os.path.join(directory, f"vllmwatch-{marker}.pgid") if directory else None


def remember(marker: str, pgid: int | None) -> None:
    """Record (or with None, forget) the child's group and its leader's start time."""
    path = path_of(marker)
    if path is None:
        return
    with _WRITE:
        if pgid is None:
            with contextlib.suppress(OSError):
                os.unlink(path)
            return
        since_boot = kin.started(pgid)
        try:
            started = psutil.Process(pgid).create_time()
        except psutil.Error:
            return
        if since_boot is not None:
            _write(path, Remembered(pgid, started, marker, since_boot, kin.boot_id()))


def _write(path: str, got: Remembered) -> None:
    safefile.write_private(path, json.dumps({
        "pgid": got.pgid, "started": got.started, "marker": got.marker,
        "since_boot": got.since_boot, "boot_id": got.boot_id,
        "members": [list(m) for m in got.members]}))


def remember_members(marker: str, root: int, pids: Collection[int]) -> None:
    """Add the tree's processes seen now to the record of the tree `root` leads (the file's
    group; nothing when it names another). Members still alive stay: a descendant that left
    the tree (its parent died: it was reparented) is the one a later start must find."""
    path = path_of(marker)
    if path is None:
        return
    with _WRITE:
        got = read(marker)
        if got is None or got.pgid != root or got.boot_id != kin.boot_id():
            return
        kept = {pid: at for pid, at in got.members if _same(pid, at)}
        for pid in pids:
            at = kin.started(pid)
            if pid != root and at is not None:
                kept.setdefault(pid, at)
        members = tuple(sorted(kept.items()))[:MEMBERS_MAX]
        if set(members) != set(got.members):
            _write(path, replace(got, members=members))


def _same(pid: int, since_boot: float) -> bool:
    """`pid` is still the process that started at `since_boot` (this boot). Exact: both are
    the kernel's tick count over the same divisor (no slack in which a reused pid could hide)."""
    return kin.started(pid) == since_boot


def recorded_members(marker: str) -> dict[int, str]:
    """The remembered tree's members that still run as the processes seen, of our user:
    pid -> why that proves it ours (for the log). Empty for a file of another boot."""
    got = read(marker)
    if got is None or not got.members or got.boot_id != kin.boot_id():
        return {}
    out = {}
    for pid, at in got.members:
        with contextlib.suppress(psutil.Error, OSError):
            if _same(pid, at) and psutil.Process(pid).uids().real == os.geteuid():
                out[pid] = (f"seen in the vLLM tree of pid {got.pgid} by a vllmwatch of this "
                            f"config (a memory sample), and still the process that started "
                            f"then ({at:.2f} s after boot, user {os.geteuid()})")
    return out


def recognised(procs: list[psutil.Process], taken: Collection[int], marker: str, me: int,
               log: LogFn | None) -> list[psutil.Process]:
    """Of `procs`, none of which another rule of child.find_tree made ours, those the record
    proves ours (recorded_members) and no other live vllmwatch's, each logged: the one rule
    that names what nothing else ties to us any more, so it is asked last. `taken`: pids
    the other rules took (never named here)."""
    seen = recorded_members(marker)
    out = [p for p in procs if p.pid in seen and p.pid not in taken
           and kin.owning_daemon(p, me) is None]
    for proc in out:
        if log is not None:
            log("warning", "leftovers.recognised", process=kin.describe_all([proc])[0],
                why=seen[proc.pid])
    return out


def read(marker: str) -> Remembered | None:
    """What a trusted group file of this instance says; None when absent or untrusted."""
    path = path_of(marker)
    text = safefile.read_private(path) if path else None
    if text is None:
        return None
    try:
        data = json.loads(text)
        since = data.get("since_boot")
        got = Remembered(int(data["pgid"]), float(data["started"]), str(data["marker"]),
                         None if since is None else float(since), str(data.get("boot_id", "")),
                         tuple((int(p), float(t)) for p, t in data.get("members", ())))
    except (ValueError, KeyError, TypeError):
        return None
    return got if got.marker == marker and got.pgid > 1 else None


def proven(got: Remembered) -> str | None:
    """None when the remembered group is provably ours; else why it is not."""
    try:
        leader = psutil.Process(got.pgid)
        group = os.getpgid(got.pgid)
    except (psutil.Error, OSError):
        return LEADER_GONE
    starts = got.start_of(got.pgid)
    if starts is None:
        return LEADER_GONE
    if group != got.pgid:
        return "the pid now leads no group of ours"
    if abs(starts[0] - starts[1]) <= _START_SLACK_S:
        return None
    if carries_marker(leader, got.marker):
        return None
    return "its leader started at another time (a recycled pid)"


LEADER_GONE = "its leader is gone"


def leaderless(marker: str) -> Remembered | None:
    """The remembered group when only its leader is gone (vLLM's API server died, then its
    vllmwatch was SIGKILLed): its members may still run (orphan_of)."""
    got = read(marker)
    return got if got is not None and proven(got) == LEADER_GONE else None


def orphan_of(got: Remembered, proc: psutil.Process, group: int, session: int) -> bool:
    """`proc` is left of the remembered group whose leader is gone: in its group or session
    (Linux gives no new process a pid still used as a group or session id, so while a member
    lives the id is still that group's), of our user, started after its leader. vLLM's titles
    erase the marker of an engine (VLLM::EngineCore): without this, an engine orphaned by a
    SIGKILLed vllmwatch kept its GPU memory through the next start."""
    if got.pgid not in (group, session):
        return False
    with contextlib.suppress(psutil.Error, OSError):
        starts = got.start_of(proc.pid)
        return proc.uids().real == os.geteuid() and starts is not None and \
            starts[0] >= starts[1] - _START_SLACK_S
    return False


def carries_marker(proc: psutil.Process, marker: str) -> bool:
    """The process runs as us and carries our marker. Anyone can set an environment
    variable, so a process of another user never counts, whatever its environment."""
    with contextlib.suppress(psutil.Error, OSError):
        return proc.uids().real == os.geteuid() and proc.environ().get(MARKER) == marker
    return False


# --- one daemon per config: the instance lock (was shell/instancelock.py) --------------------
# One daemon per config: an exclusive flock per instance, held for the daemon's lifetime.
#
# Two `vllmwatch run` on one config share the environment marker, so each took the other's live
# vLLM for its own leftover and killed it, again and again. The second one now finds the lock
# taken and leaves at once (exitcodes.ALREADY_RUNNING) before it binds a port, sweeps or
# launches anything.
#
# The lock file lives where the process-group file does (state_dir, above: only our user can
# write there), one per instance id. The kernel drops an flock when its holder dies, SIGKILL
# included, so a crashed daemon never leaves a stale lock; the file itself stays (unlinking a
# lock file races with the next daemon opening it). The descriptor is not inherited
# (O_CLOEXEC), so a vLLM tree that outlives its daemon holds no lock either.

class AlreadyRunning(Exception):
    """Another live vllmwatch holds this instance's lock."""

    def __init__(self, path: str, pid: int | None) -> None:
        super().__init__(f"{path} is held by pid {pid}")
        self.path, self.pid = path, pid


@dataclass
class InstanceLock:
    """The held lock: keep it open while the daemon runs."""

    path: str
    fd: int

    def release(self) -> None:
        """Close the descriptor (the kernel drops the lock); the file stays."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


def lock_path(marker: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The lock file of this instance, or None when there is no trusted place for it."""
    directory = state_dir(environ)
    return os.path.join(directory, f"vllmwatch-{marker}.lock") if directory else None


def lock_holder(path: str) -> int | None:
    """The pid the holder wrote into the lock file; None when unreadable."""
    text = safefile.read_private(path, limit=64)
    if text is None:
        return None
    with contextlib.suppress(ValueError):
        return int(text.strip())
    return None


def acquire_lock(marker: str, environ: Mapping[str, str] | None = None) -> InstanceLock | str:
    """Take the lock; a text says why there is none to take (no trusted directory, an
    untrusted file). Raises AlreadyRunning when a live daemon holds it."""
    path = lock_path(marker, environ)
    if path is None:
        return "no private state directory (STATE_DIRECTORY, RUNTIME_DIRECTORY, ~/.local/state)"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return f"cannot open {path}: {exc.strerror or exc}"
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or not safefile.trusted(st):
        os.close(fd)
        return f"{path} is not a regular file of ours that only we can write"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AlreadyRunning(path, lock_holder(path)) from None
    except OSError as exc:
        os.close(fd)
        return f"cannot lock {path}: {exc.strerror or exc}"
    with contextlib.suppress(OSError):  # who holds it, for the next daemon's message
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return InstanceLock(path, fd)


def spare_socket_name(instance: str) -> str:
    """The spare's socket file in its folder (shell/sparefx.socket_path chooses the folder)."""
    return f"spare-{instance[:12]}.sock"


def remove_stale_socket(environ: Mapping[str, str], instance: str, log: LogFn) -> None:
    """At the daemon's start, after the leftovers' sweep: the socket file of a spare whose
    vllmwatch was killed before it could remove it (nothing of vLLM's unlinks it) goes, unless
    something still listens there (a leftover kept: restart.kill_stale = false)."""
    name = spare_socket_name(instance)
    for where in (state_dir(environ), f"/tmp/vllmwatch-{os.geteuid()}"):
        path = os.path.join(where, "spare", name) if where else ""
        try:
            if not path or not stat.S_ISSOCK(os.lstat(path).st_mode):
                continue
            with socket.socket(socket.AF_UNIX) as probe:
                probe.settimeout(1.0)
                probe.connect(path)  # a listener: kept
        except ConnectionRefusedError:  # (a timeout: a listener slow to accept, kept)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                log("info", "spare.socket_removed", path=path,
                    detail="left by a vllmwatch killed before it could remove it")
        except OSError:  # not there, or not ours to look at
            continue
