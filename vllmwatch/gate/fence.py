"""The fence between the watchdog's stop orders and the gate's sends (issue 37.9).

The daemon's loop tells the gate, on its own thread and BEFORE it signals a child, that the
child's engine generation (its pid) is to stop: `order(gen)`. From then on no request is sent
to that generation, and `order` returns only once every send that had passed the check has
been written to its socket (bounded by FENCE_WAIT): what the old vLLM receives, it received
before its SIGTERM. A send that still completes after that is counted (`late`), a defect by
definition; the snapshot's readiness alone (polled, published at the end of a loop turn)
cannot give this order, since a turn may signal the child before its new state is published.
Thread-safe: `order` runs on the loop's thread, everything else on the gate's event loop.
"""

from __future__ import annotations

import threading
from collections import deque

FENCE_WAIT = 2.0  # the longest a stop order waits for sends under way (connect: 5 s cap)
REMEMBERED = 64  # stopped generations remembered (pids; a few per restart)


class Fence:
    """Which engine generations were told to stop, and the sends under way to each."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._stopped: deque[int] = deque(maxlen=REMEMBERED)
        self._signalled: deque[int] = deque(maxlen=REMEMBERED)  # the wait is over
        self._sending: dict[int, int] = {}
        self.late = 0  # sends written after the stop order's wait ended (must stay 0)
        self.timeouts = 0  # stop orders that did not see their sends done within FENCE_WAIT

    def stopped(self, gen: int | None) -> bool:
        """Whether `gen` was told to stop (None: unknown generation, never fenced)."""
        with self._cond:
            return gen is not None and gen in self._stopped

    def begin(self, gen: int | None) -> bool:
        """A send to `gen` is about to start: False (and nothing counted) if it may not."""
        if gen is None:
            return True
        with self._cond:
            if gen in self._stopped:
                return False
            self._sending[gen] = self._sending.get(gen, 0) + 1
            return True

    def sent(self, gen: int | None) -> None:
        """The send begun by begin(gen) is written (or failed): the stop order may go on."""
        if gen is None:
            return
        with self._cond:
            left = self._sending.get(gen, 0) - 1
            if left > 0:
                self._sending[gen] = left
            else:
                self._sending.pop(gen, None)
            if gen in self._signalled:
                self.late += 1
            self._cond.notify_all()

    def order(self, gen: int, wait: float = FENCE_WAIT) -> bool:
        """`gen` is told to stop: no new send to it; wait for the sends under way. True when
        none is left (False: timed out, counted)."""
        with self._cond:
            if gen not in self._stopped:
                self._stopped.append(gen)
            done = self._cond.wait_for(lambda: not self._sending.get(gen), wait)
            if not done:
                self.timeouts += 1
            if gen not in self._signalled:
                self._signalled.append(gen)
            return done
