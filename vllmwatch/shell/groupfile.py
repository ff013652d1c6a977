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
Anything else is logged by the caller and left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

from vllmwatch.config import safefile
from vllmwatch.config.safefile import state_dir as state_dir  # the rule lives there (prewarm/)
from vllmwatch.config.safefile import state_dir_candidate as state_dir_candidate
from vllmwatch.logfn import LogFn
from vllmwatch.shell import kin

MARKER = "VLLMWATCH_INSTANCE"
_START_SLACK_S = 0.05  # create_time is boot time + jiffies: equal when it is the same process


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
    if pgid is None:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    since_boot = kin.started(pgid)
    try:
        started = psutil.Process(pgid).create_time()
    except psutil.Error:
        return
    if since_boot is None:
        return
    safefile.write_private(path, json.dumps({"pgid": pgid, "started": started, "marker": marker,
                                             "since_boot": since_boot,
                                             "boot_id": kin.boot_id()}))


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
                         None if since is None else float(since), str(data.get("boot_id", "")))
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
