"""Weights in the page cache: find the files, measure residency (mincore), read them ahead."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllmwatch.config import safefile
from vllmwatch.logfn import LogFn

MAX_INDEX = 64 << 20  # a safetensors index is KiBs to a few MiB

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
PAGE = mmap.PAGESIZE
READ_CHUNK = 8 << 20  # one read call; large enough for sequential throughput
ITEM_SIZE = 256 << 20  # one unit of work, so that one big file still spreads over threads
CANCEL_POLL = 0.2  # s between two looks at a cancel (a stop of the daemon) while reading
_MAX_SAMPLED_PAGES = 1 << 18  # pages per file handed to mincore (1 GiB of 4 KiB pages)
_WINDOW_PAGES = 256  # a sampled window of a large file (1 MiB)


def weight_files(model_dir: Path) -> list[Path]:
    """The weight files vLLM would read from a local model directory or single file."""
    if model_dir.is_file():
        return [model_dir]
    if not model_dir.is_dir():
        return []
    text = safefile.text_within(model_dir / "model.safetensors.index.json", MAX_INDEX)
    if text is not None:
        try:
            names = set(json.loads(text)["weight_map"].values())
            # a name is a file of the directory (`../x` or `/etc/x` is not: never read, nor
            # evicted by the start guard); its link into the hub's blobs is followed
            found = sorted(model_dir / n for n in names if isinstance(n, str) and
                           not os.path.isabs(n) and ".." not in Path(n).parts and
                           (model_dir / n).is_file())
            if found:
                return found
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    for suffix in WEIGHT_SUFFIXES:  # vLLM prefers safetensors; never read both formats
        found = sorted(p for p in model_dir.glob("*" + suffix) if p.is_file())
        if found:
            return found
    return []


def hub_snapshot(model: str, hub_cache: Path) -> Path | None:
    """The local snapshot directory of a hub id (org/name) in a Hugging Face hub cache."""
    repo = hub_cache / ("models--" + model.replace("/", "--"))
    ref = safefile.text_within(repo / "refs" / "main", 4096)
    main = repo / "snapshots" / ref.strip() if ref and ref.strip() else None
    if main is not None and main.is_dir():
        return main
    try:
        snaps = sorted((repo / "snapshots").iterdir(), key=lambda p: p.stat().st_mtime)
    except OSError:
        return None
    return snaps[-1] if snaps else None


class _Libc:
    """mmap/mincore/munmap through ctypes; the stdlib has no mincore."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.mmap = lib.mmap
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        self.munmap = lib.munmap
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.mincore = lib.mincore
        self.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


_libc: _Libc | None = None


def _get_libc() -> _Libc | None:
    global _libc
    if _libc is None:
        try:
            _libc = _Libc()
        except (OSError, AttributeError):
            return None
    return _libc


def _windows(pages: int) -> list[tuple[int, int]]:
    """(first page, page count) windows to sample: the whole file, or evenly spread windows."""
    if pages <= _MAX_SAMPLED_PAGES:
        return [(0, pages)]
    count = _MAX_SAMPLED_PAGES // _WINDOW_PAGES
    stride = pages // count
    return [(i * stride, _WINDOW_PAGES) for i in range(count)]


def file_residency(path: Path) -> tuple[int, int] | None:
    """(resident, sampled) page counts for one file, or None when mincore is unavailable."""
    libc = _get_libc()
    if libc is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return (0, 0)
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            return _count_resident(libc, addr, (size + PAGE - 1) // PAGE)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def _count_resident(libc: _Libc, addr: int, pages: int) -> tuple[int, int] | None:
    resident = sampled = 0
    for first, count in _windows(pages):
        vec = (ctypes.c_ubyte * count)()
        if libc.mincore(addr + first * PAGE, count * PAGE, vec) != 0:
            return None
        resident += sum(b & 1 for b in vec)
        sampled += count
    return resident, sampled


def residency(paths: Iterable[Path]) -> float | None:
    """The fraction of the files' sampled pages in the page cache, weighted by file size."""
    weighted = total = 0.0
    for path in paths:
        counts = file_residency(path)
        if counts is None:
            return None
        resident, sampled = counts
        size = path.stat().st_size
        total += size
        weighted += size * (resident / sampled if sampled else 1.0)
    return weighted / total if total else 1.0


def evict(paths: Iterable[Path]) -> None:
    """Ask the kernel to drop the files' clean pages (POSIX_FADV_DONTNEED; no root needed).

    fdatasync first: dirty pages (a checkpoint just written) would survive the advice.
    Pages mapped by a running process (vLLM mmaps safetensors) stay until it unmaps them.
    """
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.fdatasync(fd)  # a no-op for clean files
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


@dataclass(frozen=True)
class WarmResult:
    """What a read-ahead did: bytes read of the total, seconds, and whether it finished."""

    read_bytes: int
    total_bytes: int
    seconds: float
    finished: bool
    errors: tuple[str, ...]
    cancelled: bool = False  # ended by its cancel (the daemon stops), not the deadline


Reader = Callable[[int, bytearray, int], int]  # (fd, buffer, offset) -> bytes read


def _pread(fd: int, buf: bytearray, offset: int) -> int:
    return os.preadv(fd, [buf], offset)


class _Warmer:
    """Worker threads reading (path, offset, length) items into per-thread buffers."""

    def __init__(self, items: Sequence[tuple[Path, int, int]], deadline: float,
                 reader: Reader) -> None:
        self.items, self.deadline, self.reader = list(items), deadline, reader
        self.lock = threading.Lock()
        self.next_item = 0
        self.read_bytes = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.done = threading.Event()
        self.running = 0

    def take(self) -> tuple[Path, int, int] | None:
        with self.lock:
            if self.next_item >= len(self.items):
                return None
            self.next_item += 1
            return self.items[self.next_item - 1]

    def work(self) -> None:
        buf = bytearray(READ_CHUNK)
        try:
            while not self.stop.is_set() and (item := self.take()) is not None:
                try:
                    self._read_item(item, buf)
                except OSError as exc:
                    with self.lock:
                        self.errors.append(f"{item[0]}: {exc.strerror or exc}")
        finally:
            with self.lock:
                self.running -= 1
                if self.running == 0:
                    self.done.set()

    def _read_item(self, item: tuple[Path, int, int], buf: bytearray) -> None:
        path, start, length = item
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.posix_fadvise(fd, start, length, os.POSIX_FADV_SEQUENTIAL)
            offset, end = start, start + length
            while offset < end and not self.stop.is_set():
                if time.monotonic() >= self.deadline:
                    self.stop.set()
                    return
                n = self.reader(fd, buf, offset)
                if n <= 0:
                    return
                n = min(n, end - offset)
                offset += n
                with self.lock:
                    self.read_bytes += n
        finally:
            os.close(fd)


def _items(paths: Iterable[Path]) -> tuple[list[tuple[Path, int, int]], int]:
    items: list[tuple[Path, int, int]] = []
    total = 0
    for path in paths:
        size = path.stat().st_size
        total += size
        items += [(path, off, min(ITEM_SIZE, size - off)) for off in range(0, size, ITEM_SIZE)]
    return items, total


def warm(paths: Sequence[Path], workers: int, deadline: float, log: LogFn,
         progress_every: float = 5.0, reader: Reader = _pread,
         cancel: threading.Event | None = None) -> WarmResult:
    """Read the files with `workers` threads until done, `deadline` (monotonic) or `cancel`
    (the daemon stops: within CANCEL_POLL, not at the deadline); never hangs.

    Threads are daemons: a read stuck in the kernel (a dead network disk) cannot hold us
    past the deadline; it is abandoned.
    """
    items, total = _items(paths)
    state = _Warmer(items, deadline, reader)
    start = time.monotonic()
    threads = [threading.Thread(target=state.work, name=f"prewarm-read-{i}", daemon=True)
               for i in range(max(1, min(workers, len(items))))]
    state.running = len(threads)
    for t in threads:
        t.start()
    told = start
    while not state.done.wait(min(CANCEL_POLL, max(0.0, deadline - time.monotonic()))):
        now = time.monotonic()
        if now >= deadline or (cancel is not None and cancel.is_set()):
            state.stop.set()
            break
        if now - told >= progress_every:
            told = now
            _progress(log, state.read_bytes, total, now - start)
    state.done.wait(0.5)  # let readers finish their current chunk; never wait longer
    seconds = time.monotonic() - start
    finished = state.read_bytes >= total and not state.errors
    return WarmResult(state.read_bytes, total, seconds, finished, tuple(state.errors),
                      cancel is not None and cancel.is_set() and not finished)


def _progress(log: LogFn, done: int, total: int, seconds: float) -> None:
    log("info", "prewarm.page_cache.progress",
        percent=round(100.0 * done / total, 1) if total else 100.0,
        read_mib=round(done / 2**20), total_mib=round(total / 2**20),
        mib_per_s=round(done / 2**20 / seconds, 1) if seconds > 0 else None)


def hub_cache_dir(env: Mapping[str, str]) -> Path:
    """Where huggingface_hub keeps downloads for this environment."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "hub"
    xdg = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or "~").expanduser() / ".cache")
    return Path(xdg) / "huggingface" / "hub"


def du(path: Path, deadline: float) -> dict[str, Any]:
    """Size and file count of a tree, without following links; stops at the deadline."""
    size = files = 0
    stack = [path]
    while stack:
        if time.monotonic() >= deadline:
            return {"bytes": size, "files": files, "partial": True}
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        size += entry.stat(follow_symlinks=False).st_blocks * 512
                        files += 1
        except OSError:
            continue
    return {"bytes": size, "files": files, "partial": False}
