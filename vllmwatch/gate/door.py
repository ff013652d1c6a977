"""The door: whether a new request may go to vLLM now, and the queue of those that wait.

Readiness comes from the daemon (a thread-safe getter over its latest snapshot) and is polled
on the gate's own event loop; requests that arrive while vLLM is starting, restarting or
draining wait here and are let through in arrival order once it is ready again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from enum import Enum


class Readiness(str, Enum):
    """What the daemon says about new requests."""

    OPEN = "open"  # vLLM is READY and not draining: forward
    HOLD = "hold"  # starting, restarting, draining: wait
    CLOSED = "closed"  # vllmwatch is stopping for good or gave up: refuse at once

    def __str__(self) -> str:
        return self.value


def readiness_of(state: str, ready: bool, draining: bool,
                 restart_phase: str = "idle") -> Readiness:
    """Map the daemon's snapshot fields to what the gate does with a new request. Once
    restart.begin is published (a rung other than idle) nothing new goes to the engine that
    is going, whatever the coarse state says: a crash's RECORDING rung keeps "ready" while
    its engine is dead (on the H200 a replay sent there failed again and was answered 502)."""
    if state in ("stopped", "failed"):
        return Readiness.CLOSED
    if restart_phase != "idle":
        return Readiness.HOLD
    return Readiness.OPEN if ready and not draining else Readiness.HOLD


class Door:
    """Arrival-ordered waiting for OPEN; all methods run on the gate's event loop."""

    def __init__(self, get_readiness: Callable[[], Readiness], poll: float = 0.05) -> None:
        self._get = get_readiness
        self._poll = poll
        self._waiters: deque[asyncio.Future[bool]] = deque()
        self.state = Readiness.HOLD
        self.suspect_until = 0.0  # after a refused connection: hold briefly even if "open"
        # Times the daemon's readiness turned OPEN: without the daemon's generation (the
        # child's pid), each opening stands for a new engine (a replay waits for the next).
        self.epoch = 0
        self._was_open = False

    @property
    def waiting(self) -> int:
        """How many requests wait right now."""
        return len(self._waiters)

    def refresh(self) -> None:
        """Read readiness now and release the waiters if it allows."""
        loop = asyncio.get_running_loop()
        state = self._get()
        if state == Readiness.OPEN and not self._was_open:
            self.epoch += 1
        self._was_open = state == Readiness.OPEN
        if state == Readiness.OPEN and loop.time() < self.suspect_until:
            state = Readiness.HOLD
        self.state = state
        if state == Readiness.HOLD:
            return
        while self._waiters:  # FIFO: the first to arrive is the first to be woken
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(state == Readiness.OPEN)

    async def watch(self) -> None:
        """Poll readiness for as long as the gate runs."""
        while True:
            self.refresh()
            await asyncio.sleep(self._poll)

    async def enter(self, timeout: float) -> bool | None:
        """Wait until new requests may pass: True; refused for good: False; timeout: None."""
        if not self._waiters:
            self.refresh()
            if self.state != Readiness.HOLD:
                return self.state == Readiness.OPEN
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            return None
        finally:
            if not fut.done():
                fut.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(fut)

    def suspect(self, seconds: float) -> None:
        """vLLM refused a connection although the daemon said ready: hold for a moment."""
        self.suspect_until = asyncio.get_running_loop().time() + seconds
        self.state = Readiness.HOLD
