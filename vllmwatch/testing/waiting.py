"""The one way tests wait: poll a condition until it holds or a deadline passes.

Tests never sleep to synchronise; they name what they wait for, and a timeout says it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

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


def wait_for(pred: Callable[[], Any], timeout: float, what: str = "condition",
             poll: float = 0.02) -> Any:
    """Poll pred() until it returns something truthy; fail with `what` after
    timeout * TIMEOUT_SCALE seconds."""
    return wait_until(pred, timeout * TIMEOUT_SCALE, what, poll)
