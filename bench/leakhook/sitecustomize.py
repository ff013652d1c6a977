"""Bench-only leak injector, loaded into vLLM through PYTHONPATH (bench/recovery.py).

When the file named by VLLMWATCH_BENCH_LEAK_TRIGGER appears, the `vllm serve` API-server
process (only that one) deletes it and allocates VLLMWATCH_BENCH_LEAK_MIB MiB of touched
memory that it never frees: a host-memory leak, injected from outside, in the real server.
"""

import os
import sys
import threading
import time

_TRIGGER = os.environ.get("VLLMWATCH_BENCH_LEAK_TRIGGER", "")
_HELD: list[bytes] = []


def _watch() -> None:
    for _ in range(7200):  # bounded: 1 h at 0.5 s
        time.sleep(0.5)
        if not os.path.exists(_TRIGGER) or sys.argv[1:2] != ["serve"]:
            continue
        try:
            os.unlink(_TRIGGER)
        except OSError:
            continue
        mib = int(os.environ.get("VLLMWATCH_BENCH_LEAK_MIB", "1000"))
        for _ in range(mib // 64):
            _HELD.append(b"\x01" * (64 << 20))
        print(f"[leakhook] pid {os.getpid()} leaked {mib} MiB", file=sys.stderr, flush=True)


if _TRIGGER:
    threading.Thread(target=_watch, name="bench-leak", daemon=True).start()
