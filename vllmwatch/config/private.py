"""Directories and files that only this user can write: the only places whose content we trust.

A file another local user could write (a predictable name in /tmp, a group-writable directory)
must never steer what we kill or which flags we believe vLLM accepts.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile


def trusted(st: os.stat_result) -> bool:
    """Owned by us and writable by nobody else."""
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def ensure_dir(path: str) -> str | None:
    """Create path (0700) if missing; the path when it is a trusted directory, else None."""
    with contextlib.suppress(OSError):
        os.makedirs(path, mode=0o700, exist_ok=True)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return path if stat.S_ISDIR(st.st_mode) and trusted(st) else None


def read_text(path: str, limit: int = 1 << 20) -> str | None:
    """The text of a trusted regular file (not a link), or None for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or not trusted(st):
            return None
        try:
            return fh.read(limit).decode("utf-8")
        except (OSError, UnicodeDecodeError):
            return None


def write_text(path: str, text: str) -> bool:
    """Write atomically (temp file in the same directory, then rename), mode 0600."""
    directory = os.path.dirname(path) or "."
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    return True
