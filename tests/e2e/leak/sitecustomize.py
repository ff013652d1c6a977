"""Test-only host-memory leak injector for the end-to-end tests (tests/e2e).

Python imports `sitecustomize` at start-up from the first directory on sys.path that has
one, so the e2e test puts this directory on the vLLM child's PYTHONPATH (through
[vllm.env]). It does nothing unless VLLMWATCH_E2E_LEAK_TRIGGER is set, and then only in the
API server process (`.../vllm serve ...`): EngineCore, Worker and the resource tracker are
spawned as `python -c ...` and are left alone.

In the API server a daemon thread waits for the trigger file. The first process to see it
claims it (unlink, so a restarted server does not leak again), writes `<trigger>.claimed`
(JSON: pid, wall-clock time) and then grows its heap by VLLMWATCH_E2E_LEAK_MIB_PER_S MiB/s
(default 50), touching every page so that RSS and PSS really grow, up to
VLLMWATCH_E2E_LEAK_MAX_MIB (default 1024) so a missed detection cannot eat the machine.
"""

from __future__ import annotations

import json
import os
import threading
import time

TRIGGER_ENV = "VLLMWATCH_E2E_LEAK_TRIGGER"
MIB = 1 << 20


def _is_api_server() -> bool:
    # /proc/self/cmdline rather than sys.argv: the latter may not be set up yet here.
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            argv = fh.read().decode(errors="replace").split("\0")
    except OSError:
        return False
    return len(argv) >= 3 and os.path.basename(argv[1]) == "vllm" and argv[2] == "serve"


def _claim(trigger: str) -> bool:
    try:
        os.unlink(trigger)
    except FileNotFoundError:
        return False
    with open(trigger + ".claimed.tmp", "w") as fh:
        json.dump({"pid": os.getpid(), "time": time.time()}, fh)
    os.replace(trigger + ".claimed.tmp", trigger + ".claimed")
    return True


def _leak(trigger: str, rate_mib: float, cap_mib: float) -> None:
    while not (os.path.exists(trigger) and _claim(trigger)):
        time.sleep(0.1)
    hoard: list[bytes] = []
    step = 0.1
    chunk = max(1, int(rate_mib * step * MIB))
    while len(hoard) * chunk < cap_mib * MIB:
        hoard.append(b"\x5a" * chunk)  # bytes of a non-zero value: every page is written
        time.sleep(step)
    while True:  # hold it until the supervisor restarts us
        time.sleep(3600)


def _start() -> None:
    trigger = os.environ.get(TRIGGER_ENV)
    if not trigger or not _is_api_server():
        return
    rate = float(os.environ.get("VLLMWATCH_E2E_LEAK_MIB_PER_S", "50"))
    cap = float(os.environ.get("VLLMWATCH_E2E_LEAK_MAX_MIB", "1024"))
    threading.Thread(target=_leak, args=(trigger, rate, cap), name="e2e-leak",
                     daemon=True).start()


_start()
