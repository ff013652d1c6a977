"""A bounded closed-loop load generator: N worker threads sending small completions."""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from bench._common import completion


def run_load(port: int, concurrency: int = 4, requests: int | None = 200,
             duration: float | None = None, max_tokens: int = 16,
             hard_limit: float = 600.0, ignore_eos: bool = False) -> dict[str, Any]:
    """Send `requests` completions (or run for `duration` s) at `concurrency`; bounded."""
    lock = threading.Lock()
    lat: list[float] = []
    errors = 0
    issued = 0
    t0 = time.monotonic()
    stop_at = t0 + min(duration if duration is not None else hard_limit, hard_limit)

    def worker() -> None:
        nonlocal errors, issued
        while True:
            with lock:
                if (requests is not None and issued >= requests) or time.monotonic() >= stop_at:
                    return
                issued += 1
            s = time.monotonic()
            ok = completion(port, timeout=30.0, max_tokens=max_tokens, ignore_eos=ignore_eos,
                            prompt="The quick brown fox jumps over the lazy dog")
            d = time.monotonic() - s
            with lock:
                if ok:
                    lat.append(d)
                else:
                    errors += 1

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=hard_limit + 60)
    wall = time.monotonic() - t0
    lat.sort()
    return {
        "ok": len(lat), "errors": errors, "wall_s": round(wall, 2),
        "req_per_s": round(len(lat) / wall, 2) if wall else 0.0,
        "lat_p50_ms": round(1000 * statistics.median(lat), 1) if lat else None,
        "lat_p95_ms": round(1000 * lat[int(0.95 * (len(lat) - 1))], 1) if lat else None,
    }
