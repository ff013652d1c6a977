"""Where incident records live, how one is written whole, and how old ones are pruned.

`<state dir>/incidents/<UTC time>-<reason>/` (the state directory is the process-group
file's: $STATE_DIRECTORY under the shipped unit), every folder 0700 and every file 0600 —
a record can hold prompts from vLLM's output. A record is written in a hidden folder, synced
and renamed into place, so a reader never sees half of one, nor a crash of the box an empty
one; the oldest go first beyond max_records or max_size in all (the newest is kept).

Only reads have a deadline here (record.json, ORDER: safefile.read_within). The writer's I/O
has none, deliberately: it runs in a worker thread that the core waits for only until its
deadline (core/incidents.py), and while one is stuck past it the shell begins no other
(shell/incidents.py), so a hung mount holds one thread, never the daemon, and needs no more.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vllmwatch.config import safefile

SUBDIR = "incidents"
RECORD = "record.json"
ORDER = "ORDER"  # the record ids in the order they were written, one a line (written())
ORDER_MAX = 1 << 20  # bytes of ORDER read; a prune rewrites it with the records kept
MAX_RECORD = 64 << 20  # bytes of record.json read by `vllmwatch incidents`; ours are < 1 MiB
READ_TIMEOUT = 5.0  # s for one record.json (a hung mount); then "unreadable"
_NAME = re.compile(r"^\d{8}T\d{6}Z-[a-z_]+(?:-\d+)?\Z", re.ASCII)  # (\d: 0-9 only)
# The hidden folders being written now (one can outlive its wait; mtime is no age proof)
_WRITING: set[str] = set()


def dumps(value: Any) -> str:
    """A record as JSON any parser reads: a gauge vLLM reported as NaN (or an infinity) is
    null, not the `NaN` that Python writes and JSON.parse and jq refuse or turn to null."""
    return json.dumps(_finite(value), indent=1, default=str)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def root_of(state_dir: str) -> str | None:
    """The trusted incidents folder under a state directory, created 0700; None if untrusted."""
    return safefile.private_dir(os.path.join(state_dir, SUBDIR))


def record_id(wall: float, reason: str) -> str:
    """`20261201T031502Z-hang`: sorts by time, says why."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(wall))
    return f"{stamp}-{re.sub(r'[^a-z_]', '_', reason.lower())}"


# The ids of records being captured (one can outlive the core's wait): in ORDER from their
# start, else the one written first was older (`status`, the prune) and two took one name.
_RESERVED: set[str] = set()
_RESERVING = threading.Lock()


def reserve(root: str, rid: str) -> str:
    """A record's unique id, chosen and put in ORDER when its capture begins."""
    with _RESERVING:
        final, n = rid, 1
        while final in _RESERVED or os.path.lexists(os.path.join(root, final)):
            n += 1
            final = f"{rid}-{n}"
        _RESERVED.add(final)
        _append_order(root, final)
    return final


def release(rid: str, root: str) -> None:
    """The record reserved as rid is written, or failed: then its line in ORDER goes again
    (an id naming no record was kept, read past by each reader, until a prune rewrote it)."""
    with _RESERVING:
        _RESERVED.discard(rid)
        if not os.path.lexists(os.path.join(root, rid)):
            _unlist(root, rid)


def _unlist(root: str, rid: str) -> None:
    """ORDER without rid's lines: cut off when it is the last (no block is needed on a full
    disk, the usual reason a write failed), else rewritten."""
    with contextlib.suppress(OSError, safefile.FileProblem):
        path, line = os.path.join(root, ORDER), f"{rid}\n".encode()
        raw = safefile.read_within(path, ORDER_MAX, READ_TIMEOUT, nofollow=True)
        if raw.endswith(b"\n" + line) or raw == line:
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
            try:
                os.ftruncate(fd, len(raw) - len(line))
            finally:
                os.close(fd)
        elif line in raw:
            _rewrite_order(root, [n for n in raw.decode("ascii", "replace").splitlines()
                                  if n != rid and _NAME.match(n)])


def write(root: str, rid: str,
          files: Mapping[str, str] | Callable[[str], Mapping[str, str]]) -> str:
    """Write the files of one record under root/<id> (unique; one from reserve() as it is,
    released by its reserver), whole; return the id. Files that name their record are made
    by `files(id)` once the id is chosen: a second record of a second is ID-2, not ID."""
    if rid in _RESERVED:
        return _write(root, rid, files)
    final = reserve(root, rid)
    try:
        return _write(root, final, files)
    finally:
        release(final, root)


def _write(root: str, final: str,
           files: Mapping[str, str] | Callable[[str], Mapping[str, str]]) -> str:
    tmp = os.path.join(root, f".tmp-{final}-{os.getpid()}")
    os.mkdir(tmp, 0o700)
    _WRITING.add(os.path.basename(tmp))
    try:
        for name, text in (files(final) if callable(files) else files).items():
            fd = os.open(os.path.join(tmp, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            # (a stray surrogate, a non-UTF-8 path psutil read from a cmdline, is written as
            # \udcXX: the whole record was lost with a UnicodeEncodeError)
            with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())  # the data before the name that publishes it
        _sync_dir(tmp)
        os.rename(tmp, os.path.join(root, final))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        _WRITING.discard(os.path.basename(tmp))
    _sync_dir(root)
    return final


def _sync_dir(path: str) -> None:
    """Make a folder's entries durable. The records that matter most are written just before
    a box dies (a GPU fault that hangs the kernel, the hard reset of a wedged host): without
    the syncs a folder could come back with an empty record.json (the name committed, the
    delayed data not). Best effort: a file system that cannot sync a folder still has it."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _append_order(root: str, rid: str) -> None:
    """ORDER lists the records in the order of their incidents. Ids sort by the wall clock,
    which can step back (a box without an RTC before NTP sets it): then the newest by name
    is an older run's."""
    with contextlib.suppress(OSError):  # only an order: written() falls back to the names
        fd = os.open(os.path.join(root, ORDER), os.O_WRONLY | os.O_CREAT | os.O_APPEND |
                     os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "a", encoding="ascii") as fh:
            fh.write(rid + "\n")


def written(root: str, names: list[str] | None = None, also: frozenset[str] = frozenset()
            ) -> list[str]:
    """The record ids, oldest written first: those ORDER lists, in its order, after any it
    does not (by name: written before ORDER was kept, or it was lost), and `also`'s."""
    names = ids(root) if names is None else names
    try:
        raw = safefile.read_within(os.path.join(root, ORDER), ORDER_MAX, READ_TIMEOUT,
                                   nofollow=True)
    except safefile.FileProblem:
        raw = b""
    present = set(names) | also
    # an id listed twice was written again (pruned, its line left by a rewrite that failed,
    # then the same second and reason after the clock stepped back): its last line counts
    lines = [line for line in raw.decode("ascii", "replace").splitlines() if line in present]
    order = list(reversed(dict.fromkeys(reversed(lines))))
    listed = set(order)
    return [n for n in names if n not in listed] + order


def newest(root: str, names: list[str] | None = None) -> str | None:
    """The record written last, None when there is none."""
    order = written(root, names)
    return order[-1] if order else None


def _rewrite_order(root: str, order: list[str]) -> None:
    tmp = os.path.join(root, f".tmp-order-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write("".join(f"{rid}\n" for rid in order))
        os.replace(tmp, os.path.join(root, ORDER))
    except OSError:  # (a full disk: the half-written copy goes, not left for a prune)
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def size(path: Path) -> int:
    """The bytes of the files under path (links not followed)."""
    total = 0
    for entry in path.rglob("*"):
        with contextlib.suppress(OSError):
            if entry.is_file() and not entry.is_symlink():
                total += entry.stat().st_size
    return total


def ids(root: str) -> list[str]:
    """The record ids, oldest first: one directory listing (no stat per entry where the
    file system gives the entry's type), so 10,000 records cost one pass."""
    return scan(root)[0]


def scan(root: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The record ids, oldest first, and the entries named as records that are no record's
    folder, with why: a symbolic link (to a record moved to another disk) or a file. The
    list left them out without a word: a record seemed lost. One listing for both."""
    names, others = [], []
    try:
        with os.scandir(root) as entries:
            for e in (e for e in entries if _NAME.match(e.name)):
                if _is_dir(e):
                    names.append(e.name)
                else:
                    others.append((e.name, _not_record(e)))
    except OSError:
        return [], []
    return sorted(names), sorted(others)


def _not_record(e: os.DirEntry[str]) -> str:
    if not e.is_symlink():
        return "not a folder: a record is a folder with record.json in it"
    to = "?"
    with contextlib.suppress(OSError):
        to = os.readlink(e.path)
    return (f"a symbolic link (to {to}): only a real folder is read as a record; move the "
            "folder back here, or give the folder it is in with --dir")


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def prune(root: str, max_records: int, max_bytes: int, keep: str | None = None) -> list[str]:
    """Remove the oldest written records beyond the bounds (never the newest, nor `keep`: the
    one just written); return what went. Oldest by writing, not by name: after the wall
    clock stepped back, the records written since sort first and went first."""
    order = list(names := written(root))
    sizes = {n: size(Path(root, n)) for n in names}
    total = sum(sizes.values())
    gone = []
    if keep in names:  # counted in the bounds, never removed
        names = [n for n in names if n != keep] + [keep]
    while len(names) > 1 and (len(names) > max_records or total > max_bytes):
        oldest = names.pop(0)
        shutil.rmtree(os.path.join(root, oldest), ignore_errors=True)
        total -= sizes[oldest]
        gone.append(oldest)
    if gone:
        with _RESERVING:  # a capture's line (no folder yet) is kept; one begun now waits
            kept = written(root, order, frozenset(_RESERVED))
            _rewrite_order(root, [n for n in kept if n not in gone])
    for leftover in os.listdir(root) if os.path.isdir(root) else []:
        if leftover.startswith(".tmp-") and leftover not in _WRITING:  # killed half-way
            with contextlib.suppress(OSError):
                path = os.path.join(root, leftover)
                if time.time() - os.lstat(path).st_mtime > 60:
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path, ignore_errors=True)
                    else:  # ORDER's rewrite, killed before its rename
                        os.unlink(path)
    return gone


def find(root: str, rid: str, names: list[str] | None = None) -> str | None:
    """The record named rid, or the one record whose id starts with it; None otherwise."""
    names = ids(root) if names is None else names
    if rid in names:
        return rid
    match = [n for n in names if n.startswith(rid)]
    return match[0] if len(match) == 1 else None


def read(root: str, rid: str) -> dict[str, Any] | str:
    """The record.json of the record rid as a JSON object, or why it cannot be read.

    Not safefile.read_private: root reads the service user's records (`vllmwatch incidents`),
    and that user owns the folder: record.json may be anything it made. Only a regular file
    is read (a FIFO or device is refused without blocking), at most MAX_RECORD bytes, within
    READ_TIMEOUT (safefile.read_within)."""
    path = os.path.join(root, rid, RECORD)
    try:
        raw = safefile.read_within(path, MAX_RECORD, READ_TIMEOUT, nofollow=True)
    except safefile.FileProblem as exc:
        closed = exc.errno in (errno.EACCES, errno.EPERM)  # (the folder's refusal says it too)
        return str(exc).replace(repr(path), RECORD) + (
            " (records are 0600: run as root or as the service user)" if closed else "")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        return f"record.json is not JSON ({exc})"
    except RecursionError:
        return "record.json is nested too deeply to read"
    if not isinstance(data, dict):
        return f"record.json holds a JSON {type(data).__name__}, not an object"
    # The folder's name is the id: the one asked for, listed and named by `status`. The
    # record's own may be another's (written as ID, published as ID-2: `show ID-2 --json`
    # said ID), none, or not a string; kept as stored_id where it differs.
    return {**data, "id": rid} | ({"stored_id": data["id"]} if data.get("id", rid) != rid
                                   else {})


def load(root: str, rid: str) -> dict[str, Any] | None:
    """The record.json of one record (an id or a unique prefix of one), or None."""
    got = read(root, name) if (name := find(root, rid)) is not None else None
    return got if isinstance(got, dict) else None
