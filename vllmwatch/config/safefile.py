"""Reading a file a person names (the config, vllm.api_key_file) without ever blocking on it;
and the files only this user can write, the only ones whose content we trust (at the end).

Only a regular file is read: a FIFO would block the reader until someone writes to it, a
device (/dev/zero) never ends, a directory is a mistake. The open never blocks (O_NONBLOCK:
a FIFO without a writer opens at once, and is then refused by fstat), and at most `limit`
bytes are read: a larger file is refused, never loaded whole.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

MAX_FILE = 1 << 20  # config and key files: 1 MiB; a real one is a few KiB


class FileProblem(Exception):
    """A file that cannot be used; `transient` when it may be fine a moment later.

    Transient: missing, unreadable, empty (a key rotation writes a new file and renames it;
    an editor truncates then writes). Not transient: not a regular file, too large.
    """

    def __init__(self, message: str, transient: bool, errno_: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.errno = errno_  # why open() failed, where it did (ENOENT: not there)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_bounded(path: str, limit: int = MAX_FILE, nofollow: bool = False) -> bytes:
    """The bytes of the regular file at path, at most `limit` of them; symlinks followed
    unless `nofollow` (a file another user controls: a link would read what it points at).

    Raises FileProblem with a message that names the path and what is accepted.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags | (os.O_NOFOLLOW if nofollow else 0))
    except FileNotFoundError:
        raise FileProblem(f"{path!r}: file not found", transient=True,
                          errno_=errno.ENOENT) from None
    except IsADirectoryError:
        raise FileProblem(f"{path!r} is a directory; a regular file is needed",
                          transient=False) from None
    except ValueError as exc:  # a name the file system cannot be given: an embedded NUL, or
        # a character the locale cannot encode (LC_ALL=C, PYTHONUTF8=0: a non-ASCII model)
        raise FileProblem(f"{path!r}: cannot be opened by that name: {exc}",
                          transient=False) from None
    except OSError as exc:
        if nofollow and exc.errno == errno.ELOOP:
            raise FileProblem(f"{path!r} is a symbolic link; only a regular file is read",
                              transient=False) from None
        # a path no retry opens (a symlink loop, a file where a folder should be, a name
        # too long) is no rotation in progress: a reload refuses it
        raise FileProblem(f"{path!r}: cannot open: {exc.strerror or exc}", transient=exc.errno
                          not in (errno.ELOOP, errno.ENOTDIR, errno.ENAMETOOLONG),
                          errno_=exc.errno) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileProblem(f"{path!r} is {_kind(st.st_mode)}; only a regular file is "
                              "read", transient=False)
        if st.st_size > limit:
            raise FileProblem(f"{path!r} is {st.st_size} bytes; at most {limit} are read",
                              transient=False)
        chunks: list[bytes] = []
        size = 0
        while size <= limit:  # a file that grows while we read is still capped
            chunk = os.read(fd, min(65536, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise FileProblem(f"{path!r} grew past {limit} bytes while read; at most "
                              f"{limit} are read", transient=False)
        return b"".join(chunks)
    except OSError as exc:
        raise FileProblem(f"{path!r}: cannot read: {exc.strerror or exc}",
                          transient=True) from None
    finally:
        os.close(fd)


def read_within(path: str, limit: int, timeout: float, nofollow: bool = False) -> bytes:
    """read_bounded with a deadline: a regular file on a hung network mount blocks its read in
    the kernel, which no flag avoids, so the read runs on a thread of its own and the caller
    waits at most `timeout` s. A read that has not answered by then is a transient problem
    (the thread is left to finish or hang; it holds nothing of the caller's)."""
    return _within(lambda: read_bounded(path, limit, nofollow), path, timeout)


MAX_MODEL_CONFIG = 4 << 20  # a model's config.json is a few KiB; more is not one


def text_within(path: str | os.PathLike[str], limit: int, timeout: float = 5.0) -> str | None:
    """A small UTF-8 file a model directory holds (config.json, an index, a hub ref), read
    with read_within's cap and deadline; None for anything else: a FIFO, a device, a hung
    mount or a huge file there blocked prewarm or the daemon's loop for good."""
    try:
        return read_within(os.fspath(path), limit, timeout).decode("utf-8")
    except (FileProblem, UnicodeDecodeError):
        return None


def head_within(path: str, size: int, timeout: float) -> bytes:
    """head() with read_within's deadline."""
    return _within(lambda: head(path, size), path, timeout)


def _within(read: Callable[[], bytes], path: str, timeout: float) -> bytes:
    box: list[bytes | FileProblem] = []
    done = threading.Event()

    def work() -> None:
        try:
            box.append(read())
        except FileProblem as exc:
            box.append(exc)
        except Exception as exc:  # never a thread's traceback on stderr: the caller's problem
            box.append(FileProblem(f"{path!r}: cannot be read: {type(exc).__name__}: {exc}",
                                   transient=False))
        finally:
            done.set()

    threading.Thread(target=work, name="vllmwatch-read", daemon=True).start()
    if not done.wait(timeout) or not box:
        raise FileProblem(f"{path!r}: the read did not answer within {timeout:g}s (a hung "
                          "network mount?)", transient=True)
    if isinstance(box[0], FileProblem):
        raise box[0]
    return box[0]


def head(path: str, size: int) -> bytes:
    """The first `size` bytes of the regular file at path (never blocks: see read_bounded)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise FileProblem(f"{path!r}: cannot open: {exc.strerror or exc}", True) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileProblem(f"{path!r} is {_kind(os.fstat(fd).st_mode)}", transient=False)
        return os.read(fd, size)
    except OSError as exc:
        raise FileProblem(f"{path!r}: cannot read: {exc.strerror or exc}", True) from None
    finally:
        os.close(fd)


# --- files only this user can write (was config/private.py) ----------------------------------
# Directories and files that only this user can write: the only places whose content we trust.
#
# A file another local user could write (a predictable name in /tmp, a group-writable directory)
# must never steer what we kill or which flags we believe vLLM accepts.

def trusted(st: os.stat_result) -> bool:
    """Owned by us and writable by nobody else."""
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def private_dir(path: str) -> str | None:
    """Create path (0700) if missing; the path when it is a trusted directory, else None."""
    with contextlib.suppress(OSError):
        os.makedirs(path, mode=0o700, exist_ok=True)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return path if stat.S_ISDIR(st.st_mode) and trusted(st) else None


def closed_dir(path: str) -> str | None:
    """private_dir that no other user may even enter (0700, made so when looser): what a Unix
    socket inside needs whatever mode its server gives it (the umask's: UMask=0000 makes it
    connectable by all). None when it cannot be had."""
    got = private_dir(path)
    with contextlib.suppress(OSError):
        if got is not None and os.lstat(got).st_mode & 0o077:
            os.chmod(got, 0o700)
    try:
        return got if got is not None and not os.lstat(got).st_mode & 0o077 else None
    except OSError:
        return None


def read_private(path: str, limit: int = 1 << 20) -> str | None:
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


def write_private(path: str, text: str) -> bool:
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


def foreign_owner(paths: Iterable[str]) -> tuple[str, str] | None:
    """As root: (directory, its owner's name) of the first of `paths` that another user owns
    (the path, or the nearest directory above it that exists, links followed: where root
    would create it). None when this process is not root, or all are root's: what root
    writes into another user's tree stays root's, and its owner (a service's user) cannot
    write over it."""
    if os.geteuid() != 0:
        return None
    for path in paths:
        where = os.path.abspath(path)
        while not os.path.lexists(where) and os.path.dirname(where) != where:
            where = os.path.dirname(where)
        with contextlib.suppress(OSError):
            uid = os.stat(where).st_uid
            if uid != 0:
                import pwd  # (only here: the daemon's import count)

                try:
                    return where, pwd.getpwuid(uid).pw_name
                except KeyError:
                    return where, f"#{uid}"  # as sudo -u takes a uid
    return None


def shared_dir(path: str) -> str | None:
    """Why another user could put files into the directory `path` (owned by a user other than
    us or root; writable by every user, or by a group that has members other than us, without
    the sticky bit: /tmp's may hold ours); None when only we (and root) can, or when it is not
    there. For directories whose content a process loads as code (vLLM's compile caches).
    The group rule is sshd's StrictModes (Debian's): group-writable passes only where the
    group is our own private one, its only member us (by primary group or membership)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if st.st_uid not in (os.geteuid(), 0):
        return f"{path} is owned by uid {st.st_uid}, another user"
    if st.st_mode & stat.S_ISVTX:
        return None  # others' entries may sit beside ours, never replace ours
    if st.st_mode & stat.S_IWOTH:
        return f"{path} is writable by every user (chmod o-w it)"
    if st.st_mode & stat.S_IWGRP:
        others = group_others(st.st_gid)
        if others is not None:
            return f"{path} is writable by group {others} (chmod g-w it)"
    return None


def group_others(gid: int) -> str | None:
    """None when the group `gid` is our own private group (its members: us, and root, who
    may write anywhere: root:root 0775 is safe); else the group's name and the other members
    found, for a message ("ml (members alice, bob)"). A group without members is not ours:
    whoever is given it later could write."""
    import grp  # (only here: the daemon's import count)
    import pwd

    try:
        group = grp.getgrgid(gid)
        me = {pwd.getpwuid(os.geteuid()).pw_name, pwd.getpwuid(0).pw_name}
    except KeyError:  # a gid or uid without a name: nobody can say who is in it
        return f"#{gid} (unknown members)"
    members = set(group.gr_mem) | {p.pw_name for p in pwd.getpwall() if p.pw_gid == gid}
    others = sorted(members - me)
    if members and not others:
        return None
    return f"{group.gr_name} (" + (f"members {', '.join(others[:5])}" + (
        f" and {len(others) - 5} more" if len(others) > 5 else "") if others else
        "no members: anyone given it later") + ")"


def state_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """The trusted directory for our state; None when none can be had."""
    return private_dir(state_dir_candidate(environ))


def private_cache(environ: Mapping[str, str], name: str) -> str | None:
    """A cache folder under our lasting private state directory (0700, ours): where vLLM's
    compiled code goes when its cache folder is one other users can write into; None: no
    such place."""
    state = private_dir(lasting_state_candidate(environ))
    base = closed_dir(os.path.join(state, "private-cache")) if state else None
    return closed_dir(os.path.join(base, name)) if base else None


LASTING_ROOT_STATE = "/var/lib/vllmwatch"  # the shipped unit's StateDirectory=


def lasting_state_candidate(environ: Mapping[str, str]) -> str:
    """state_dir_candidate on a disk, never a tmpfs: compiled code is hundreds of MiB that
    would sit in RAM (on a Spark, in the GPU's own memory) and go at every reboot, and
    outside systemd the rule's root fallback is /run and a user's is $XDG_RUNTIME_DIR."""
    first = environ.get("STATE_DIRECTORY", "").split(":")[0]
    if first:
        return first
    if os.geteuid() == 0:
        return LASTING_ROOT_STATE
    home = environ.get("XDG_STATE_HOME") or os.path.join(
        environ.get("HOME") or str(Path.home()), ".local", "state")
    return os.path.join(home, "vllmwatch")


def state_dir_candidate(environ: Mapping[str, str] | None = None) -> str:
    """Where our state goes by the rule, trusted or not (for a message that names it)."""
    env = os.environ if environ is None else environ
    for name in ("STATE_DIRECTORY", "RUNTIME_DIRECTORY"):
        first = env.get(name, "").split(":")[0]
        if first:
            return first
    if os.geteuid() == 0:
        return "/run/vllmwatch"
    runtime = env.get("XDG_RUNTIME_DIR", "")
    return (os.path.join(runtime, "vllmwatch") if runtime else
            os.path.join(env.get("HOME") or str(Path.home()), ".local", "state", "vllmwatch"))
