"""The one way tests wait: poll a condition until it holds or a deadline passes.

Tests never sleep to synchronise; they name what they wait for, and a timeout says it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any, TypeVar

from vllmwatch.incident.dumpers import process_state

T = TypeVar("T")


def wait_until(pred: Callable[[], T], timeout: float, what: str = "condition",
               poll: float = 0.02) -> T:
    """Poll pred() until it returns something truthy and return that; raise AssertionError
    naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(poll)


def holds_within(pred: Callable[[], object], timeout: float, poll: float = 0.05) -> bool:
    """Poll pred() until truthy or timeout; return whether it held (for checks that report)."""
    try:
        wait_until(pred, timeout, poll=poll)
    except AssertionError:
        return False
    return True


# Deadlines are upper bounds, so stretching them costs nothing when all goes well; on a
# loaded 2-core machine (a real vLLM next door) a daemon start alone can take seconds.
TIMEOUT_SCALE = float(os.environ.get("VLLMWATCH_TEST_TIMEOUT_SCALE", "3"))
# The least a daemon's first start is waited for (before TIMEOUT_SCALE): it pays for the
# daemon's and the fake's fresh interpreters while, on CI, the real-vLLM lane compiles beside
# it (a 2-core box once took 50 s there). No test bounds that speed; bench/ does.
FIRST_READY_S = 60.0


def wait_for(pred: Callable[[], Any], timeout: float, what: str = "condition",
             poll: float = 0.02) -> Any:
    """Poll pred() until it returns something truthy; fail with `what` after
    timeout * TIMEOUT_SCALE seconds."""
    return wait_until(pred, timeout * TIMEOUT_SCALE, what, poll)


def _threads_stopped(pid: int) -> bool:
    """Every thread of pid is in group stop (state T); a gone process or thread counts as
    stopped. /proc/TID/stat answers for a thread as for a process."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    return all(process_state(int(tid)) in ("T", "t", "") for tid in tids)


def sigstop(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP pid and return once every one of its threads has stopped.

    kill() only queues the signal: a thread running on another CPU, or woken from a read,
    can still answer a ping or serve a request for a moment after kill() returns (CI saw a
    standby answer a ping written after its SIGSTOP). A test that asserts on "stopped" waits
    for the stop itself."""
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: _threads_stopped(pid), timeout, f"pid {pid} to stop (SIGSTOP)")
