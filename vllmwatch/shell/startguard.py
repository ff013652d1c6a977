"""The start guard's I/O on unified memory: from launch until READY, watch MemFree and evict.

One daemon thread per start. It posts nothing into the core: it reads /proc/meminfo about
once a second, asks core.unified.guard_actions what to do, does it (fadvise eviction of the
checkpoint's pages; drop_caches / compact_memory only when configured and permitted) and
logs each action with its numbers. The launch starts it (shell/childrun.py); the core's
StartOver action (READY, or the start was left) or the child's reap stops it; `summary()`
gives the figures a diagnosis needs ("page cache held N GiB at start").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllmwatch.config.schema import Config
from vllmwatch.core.unified import GuardSettings, MemInfo, floor_for, guard_actions
from vllmwatch.logfn import LogFn
from vllmwatch.prewarm.evict import EvictResult, evict_measured
from vllmwatch.prewarm.pagecache import weight_files
from vllmwatch.prewarm.runner import model_dir
from vllmwatch.shell import platform


@dataclass
class GuardIO:
    """Seams for tests: the clock, /proc/meminfo, the eviction and the /proc/sys/vm writes."""

    monotonic: Callable[[], float]
    read_meminfo: Callable[[], MemInfo | None] = platform.read_meminfo
    evict: Callable[[Sequence[Path]], EvictResult] = evict_measured
    write_vm: Callable[[str], str | None] = platform.write_vm
    may_write_vm: Callable[[], bool] = platform.may_write_vm


def settings_of(config: Config, may_write: bool) -> GuardSettings:
    """The pure decision's settings from the config."""
    m = config.memory
    return GuardSettings(floor_mib=m.guard_floor, min_gap_s=m.guard_min_gap,
                         drop_caches=m.guard_drop_caches, compact=m.guard_compact,
                         may_write_proc=may_write)


@dataclass
class GuardSummary:
    """What the guard saw during one start."""

    launch: MemInfo | None = None
    min_free_mib: float | None = None
    actions: int = 0
    evicted_mib: float = 0.0
    errors: list[str] = field(default_factory=list)

    def page_cache_gib(self) -> float | None:
        """Page cache (Cached) at launch in GiB, before the launch eviction."""
        return None if self.launch is None else round(self.launch.cached_mib / 1024, 1)


class StartGuard:
    """Evicts the checkpoint at launch, then whenever MemFree falls under the floor."""

    def __init__(self, files: Sequence[Path], config: Config, log: LogFn, io: GuardIO) -> None:
        self._files, self._log, self._io = list(files), log, io
        self._interval = config.memory.guard_interval
        self._settings = settings_of(config, io.may_write_vm())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_action: float | None = None
        self.summary = GuardSummary()

    def start(self) -> None:
        """Start the guard thread (the launch eviction runs first, in the thread)."""
        self._thread = threading.Thread(target=self._run, name="start-guard", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Started and not told to stop."""
        return self._thread is not None and not self._stop.is_set()

    def stop(self, why: str) -> None:
        """Stop sampling (READY or the child exited) and log what the guard did.

        Never waits: the loop calls it, and an eviction in progress finishes on its own.
        """
        if self._stop.is_set():
            return
        self._stop.set()
        s = self.summary
        self._log("info", "guard.stopped", why=why, actions=s.actions,
                  evicted_mib=round(s.evicted_mib, 1),
                  min_free_mib=None if s.min_free_mib is None else round(s.min_free_mib))

    def _run(self) -> None:
        try:
            self.launch()
            while not self._stop.wait(self._interval):
                self.tick()
        except Exception as exc:  # the guard must never take the daemon down
            self._log("warning", "guard.failed", error=f"{type(exc).__name__}: {exc}")

    def launch(self) -> None:
        """At spawn: record the memory picture and evict the checkpoint once."""
        reading = self._io.read_meminfo()
        self.summary.launch = reading
        floor = floor_for(self._settings, reading.total_mib) if reading else None
        self._log("info", "guard.started", files=len(self._files),
                  floor_mib=None if floor is None else round(floor),
                  interval_s=self._interval, **_mem(reading),
                  drop_caches=self._settings.drop_caches and self._settings.may_write_proc,
                  compact=self._settings.compact and self._settings.may_write_proc)
        self._evict("launch", reading)

    def tick(self) -> tuple[str, ...]:
        """One sample: read, decide, act. Returns the actions taken."""
        reading = self._io.read_meminfo()
        if reading is None:
            return ()
        s = self.summary
        s.min_free_mib = reading.free_mib if s.min_free_mib is None else min(
            s.min_free_mib, reading.free_mib)
        now = self._io.monotonic()
        acts = guard_actions(reading, self._settings, now, self._last_action)
        if not acts:
            return ()
        self._last_action = now
        self._log("warning", "guard.low_memory", **_mem(reading),
                  floor_mib=round(floor_for(self._settings, reading.total_mib)),
                  actions=",".join(acts))
        for act in acts:
            if act == "evict":
                self._evict("memfree_below_floor", reading)
            else:
                self._vm(act)
        return acts

    def _evict(self, why: str, reading: MemInfo | None) -> None:
        if not self._files:
            return
        res = self._io.evict(self._files)
        self.summary.actions += 1
        self.summary.evicted_mib += (res.freed_bytes or 0) / 2**20
        after = self._io.read_meminfo()
        self._log("info", "guard.evict", why=why, **res.fields(),
                  memfree_before_mib=None if reading is None else round(reading.free_mib),
                  memfree_after_mib=None if after is None else round(after.free_mib))

    def _vm(self, act: str) -> None:
        path = platform.DROP_CACHES if act == "drop_caches" else platform.COMPACT_MEMORY
        before = self._io.read_meminfo()
        error = self._io.write_vm(path)
        after = self._io.read_meminfo()
        self.summary.actions += 1
        if error:
            self.summary.errors.append(error)
        self._log("warning" if error else "info", f"guard.{act}", error=error,
                  memfree_before_mib=None if before is None else round(before.free_mib),
                  memfree_after_mib=None if after is None else round(after.free_mib))


def _mem(reading: MemInfo | None) -> dict[str, Any]:
    if reading is None:
        return {"memfree_mib": None}
    return {"memfree_mib": round(reading.free_mib), "memavailable_mib":
            round(reading.available_mib), "cached_mib": round(reading.cached_mib),
            "total_mib": round(reading.total_mib)}


def make_guard(config: Config, unified: bool, log: LogFn, environ: dict[str, str],
               monotonic: Callable[[], float]) -> StartGuard | None:
    """The guard for one start, or None: off on discrete GPUs and with memory.guard = false."""
    if not unified or not config.memory.guard:
        return None
    where = model_dir(config, environ)
    files = weight_files(where) if where else []
    if not files:
        log("warning", "guard.no_files", model=config.vllm.model,
            effect="only MemFree is watched; nothing of ours to evict (is vllm.model a "
                   "local directory or a downloaded hub id?)")
    return StartGuard(files, config, log, GuardIO(monotonic))
