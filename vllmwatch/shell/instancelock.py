"""One daemon per config: an exclusive flock per instance, held for the daemon's lifetime.

Two `vllmwatch run` on one config share the environment marker, so each took the other's live
vLLM for its own leftover and killed it, again and again. The second one now finds the lock
taken and leaves at once (exitcodes.ALREADY_RUNNING) before it binds a port, sweeps or
launches anything.

The lock file lives where the process-group file does (groupfile.state_dir: only our user can
write there), one per instance id. The kernel drops an flock when its holder dies, SIGKILL
included, so a crashed daemon never leaves a stale lock; the file itself stays (unlinking a
lock file races with the next daemon opening it). The descriptor is not inherited
(O_CLOEXEC), so a vLLM tree that outlives its daemon holds no lock either.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from vllmwatch.config import private
from vllmwatch.shell import groupfile


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


def path_of(marker: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The lock file of this instance, or None when there is no trusted place for it."""
    directory = groupfile.state_dir(environ)
    return os.path.join(directory, f"vllmwatch-{marker}.lock") if directory else None


def holder(path: str) -> int | None:
    """The pid the holder wrote into the lock file; None when unreadable."""
    text = private.read_text(path, limit=64)
    if text is None:
        return None
    with contextlib.suppress(ValueError):
        return int(text.strip())
    return None


def acquire(marker: str, environ: Mapping[str, str] | None = None) -> InstanceLock | str:
    """Take the lock; a text says why there is none to take (no trusted directory, an
    untrusted file). Raises AlreadyRunning when a live daemon holds it."""
    path = path_of(marker, environ)
    if path is None:
        return "no private state directory (STATE_DIRECTORY, RUNTIME_DIRECTORY, ~/.local/state)"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return f"cannot open {path}: {exc.strerror or exc}"
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or not private.trusted(st):
        os.close(fd)
        return f"{path} is not a regular file of ours that only we can write"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AlreadyRunning(path, holder(path)) from None
    except OSError as exc:
        os.close(fd)
        return f"cannot lock {path}: {exc.strerror or exc}"
    with contextlib.suppress(OSError):  # who holds it, for the next daemon's message
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return InstanceLock(path, fd)
