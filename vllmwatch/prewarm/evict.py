"""Eviction of a model's files from the page cache, measured with mincore (unified memory).

On unified memory (DGX Spark) the page cache competes with GPU allocations, and vLLM's
start-up check counts it as used: the opposite of a pre-warm is what a start needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllmwatch.logfn import LogFn
from vllmwatch.prewarm.pagecache import evict, file_residency


def resident_bytes(paths: Iterable[Path]) -> int | None:
    """Bytes of the files in the page cache (estimated from sampled windows for big files)."""
    total = 0.0
    for path in paths:
        counts = file_residency(path)
        if counts is None:
            return None
        resident, sampled = counts
        total += path.stat().st_size * (resident / sampled if sampled else 0.0)
    return int(total)


@dataclass(frozen=True)
class EvictResult:
    """What an eviction did, measured with mincore: resident bytes before and after."""

    files: int
    total_bytes: int
    before_bytes: int | None
    after_bytes: int | None

    @property
    def freed_bytes(self) -> int | None:
        """Bytes that left the page cache; None when mincore could not measure."""
        if self.before_bytes is None or self.after_bytes is None:
            return None
        return max(0, self.before_bytes - self.after_bytes)

    def fields(self) -> dict[str, object]:
        """Log fields in MiB."""
        def mib(n: int | None) -> float | None:
            return None if n is None else round(n / 2**20, 1)
        return {"files": self.files, "total_mib": mib(self.total_bytes),
                "resident_before_mib": mib(self.before_bytes),
                "resident_after_mib": mib(self.after_bytes), "freed_mib": mib(self.freed_bytes)}


def evict_measured(paths: Sequence[Path]) -> EvictResult:
    """Evict the files from the page cache and measure residency before and after."""
    total = sum(p.stat().st_size for p in paths if p.exists())
    before = resident_bytes(paths)
    evict(paths)
    return EvictResult(len(paths), total, before, resident_bytes(paths))


def step(files: list[Path], log: LogFn) -> tuple[str, str, dict[str, Any]]:
    """The pre-warm's page-cache step on unified memory: the page cache is what vLLM's
    start-up check counts as used, so the weights are evicted, not read."""
    res = evict_measured(files)
    log("info", "prewarm.page_cache.evicted", **res.fields())
    data: dict[str, Any] = {"unified": True, **res.fields()}
    if res.before_bytes is None:
        return "ok", (f"unified memory: evicted {len(files)} weight files from the page "
                      "cache (residency not measurable here)"), data
    return "ok", (f"unified memory: evicted the weights from the page cache "
                  f"({res.before_bytes / 2**20:.1f} MiB resident before, "
                  f"{(res.freed_bytes or 0) / 2**20:.1f} MiB freed)"), data

