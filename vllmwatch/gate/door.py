"""The door: whether a new request may go to vLLM now, and the queue of those that wait;
the fence: which engine generations no request may be sent to any more (below); and the
gate's figures (GateStats, GenFigures). The API key is gate/apikey.py's.

Readiness comes from the daemon (a thread-safe getter over its latest snapshot) and is polled
on the gate's own event loop; requests that arrive while vLLM is starting, restarting or
draining wait here and are let through in arrival order once it is ready again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

STOPPING = "vllmwatch is stopping; vLLM will not come back on this instance"  # CLOSED's 503
UNAUTHORIZED = {"error": "Unauthorized"}  # vLLM's own 401 body (authenticate.py:60)


class Readiness(str, Enum):
    """What the daemon says about new requests."""

    OPEN = "open"  # vLLM is READY and not draining: forward
    HOLD = "hold"  # starting, restarting, draining: wait
    CLOSED = "closed"  # vllmwatch is stopping for good or gave up: refuse at once

    def __str__(self) -> str:
        return self.value


def readiness_of(state: str, ready: bool, draining: bool,
                 restart_phase: str = "idle", exiting: bool = False) -> Readiness:
    """Map the daemon's snapshot fields to what the gate does with a new request. Once
    restart.begin is published (a rung other than idle) nothing new goes to the engine that
    is going, whatever the coarse state says: a crash's RECORDING rung keeps "ready" while
    its engine is dead (on the H200 a replay sent there failed again and was answered 502).
    `exiting`: vllmwatch decided its exit (the snapshot's exit_code), and its stop (vLLM's
    own drain, the sweep) runs in states a restart has too: no engine comes back, so a
    request is refused at once, never held until gate.hold_timeout for none."""
    if exiting or state in ("stopped", "failed"):
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
        self._closed = False  # the gate stops: CLOSED from now on, whatever the daemon says

    @property
    def waiting(self) -> int:
        """How many requests wait right now."""
        return len(self._waiters)

    def refresh(self) -> None:
        """Read readiness now and release the waiters if it allows."""
        loop = asyncio.get_running_loop()
        state = Readiness.CLOSED if self._closed else self._get()
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

    def close(self) -> None:
        """The gate stops: every request waiting here, and every later one, is refused now
        (503 "vllmwatch is stopping"), never left to the server's shutdown grace, which
        drops its connection without an answer (the watcher's last poll may predate the
        daemon's final "stopped")."""
        self._closed = True
        self.refresh()

    def suspect(self, seconds: float) -> None:
        """vLLM refused a connection although the daemon said ready: hold for a moment."""
        self.suspect_until = asyncio.get_running_loop().time() + seconds
        self.state = Readiness.HOLD


# ---- the fence ----------------------------------------------------------------------
# The fence between the watchdog's stop orders and the gate's sends (issue 37.9).
#
# The daemon's loop tells the gate, on its own thread and BEFORE it signals a child, that the
# child's engine generation (its pid) is to stop: `order(gen)`. From then on no request is sent
# to that generation, and `order` returns only once every send that had passed the check has
# been written to its socket (bounded by FENCE_WAIT): what the old vLLM receives, it received
# before its SIGTERM. A send that still completes after that is counted (`late`), a defect by
# definition; the snapshot's readiness alone (polled, published at the end of a loop turn)
# cannot give this order, since a turn may signal the child before its new state is published.
# Thread-safe: `order` runs on the loop's thread, everything else on the gate's event loop.

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

    def forget(self, gen: int) -> None:
        """`gen` is a new engine now (vllmwatch launched it: a pid reused by the kernel): its
        stop order was another process's, and would hold the door for this one for good."""
        with self._cond:
            for told in (self._stopped, self._signalled):
                while gen in told:
                    told.remove(gen)
            self._sending.pop(gen, None)

    def begin(self, gen: int | None) -> bool:
        """A send to `gen` is about to start: False (and nothing counted) if it may not."""
        if gen is None:
            return True
        with self._cond:
            if gen in self._stopped:
                return False
            self._sending[gen] = self._sending.get(gen, 0) + 1
            return True

    def sent(self, gen: int | None, written: bool = True) -> None:
        """The send begun by begin(gen) is written (or failed): the stop order may go on.
        `written` False: nothing of it reached the engine (never connected), so never late."""
        if gen is None:
            return
        with self._cond:
            left = self._sending.get(gen, 0) - 1
            if left > 0:
                self._sending[gen] = left
            else:
                self._sending.pop(gen, None)
            if gen in self._signalled and written:
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


# ---- the gate's figures ----------------------------------------------------------------

@dataclass
class GateStats:
    """Counters of the gate; written on its event loop only, read from any thread."""

    forwarded: int = 0  # requests sent to vLLM (a replay is sent again: counted again)
    held: int = 0  # requests that had to wait at the door
    hold_timeouts: int = 0  # answered 503 after gate.hold_timeout
    refused_closed: int = 0  # answered 503 because vllmwatch is stopping or gave up
    failed_midrequest: int = 0  # vLLM went away after the request was sent
    connect_retries: int = 0  # vLLM refused the connection; held again, then sent
    holding: int = 0  # waiting at the door now
    in_flight: int = 0  # forwarded and not yet answered
    # Replays (gate/replay.py): of the failures before the answer began, by outcome.
    replayed: int = 0  # sent once more to the next engine
    replay_answered: int = 0  # ... and that engine answered it (any status)
    replay_gave_up: int = 0  # replay_max reached, or hold_timeout/stop while waiting: 502/503
    not_replayed: int = 0  # replay off, a path not on the list, or a body over the bound: 502
    cut_midstream: int = 0  # the answer had begun: stream ended with an error event, or cut
    stop_orders: int = 0  # engine generations vllmwatch told to stop (the fence)
    forwarded_after_stop: int = 0  # sent to an engine after its stop order: a defect, 0
    # Bounds (gate/guard.py): connections shed and refused requests, by reason.
    shed_connections: int = 0  # over the connection cap: 503 and closed at once
    idle_timeouts: int = 0  # no request within the idle deadline: closed
    header_timeouts: int = 0  # a request head not complete within its deadline: closed
    body_timeouts: int = 0  # a request body not complete within its deadline: 408
    too_large: int = 0  # a request body over the cap: 413
    bad_encoding: int = 0  # a transfer coding other than chunked (gzip, chunked): 501
    held_full: int = 0  # the bodies held at once would pass their cap: 503
    upstream_timeouts: int = 0  # vLLM's answer not complete within its deadline: 504
    path_refused: int = 0  # a path not on the client API allow-list (gate/replay.py): 404
    clients_left: int = 0  # clients that left before their answer (mid-upload): not errors
    quarantined: int = 0  # requests that killed an engine alone (gate/replay.py Suspects)
    quarantine_refused: int = 0  # ... sent again while quarantined: 422
    unauthorized: int = 0  # no or a wrong API key on a path vLLM leaves open (key_refused): 401
    connections: int = 0  # client connections open now
    held_bytes: int = 0  # request bodies in memory now


@dataclass
class GenFigures:
    """What became of the requests in flight to one engine generation when it failed or was
    told to stop (the incident record's "N in flight: M replayed, K cut"); the gate's loop's."""

    failed: int = 0  # ended with nothing of the answer sent (reset, engine-dead, cut)
    replayed: int = 0  # ... and sent back to the door for the next engine
    # ... and not sent again (replay off, not on the list, replay_max): answered 502, 504
    # (its deadline), or vLLM's own answer as it came (an aborted completion: a 200)
    not_replayed: int = 0
    cut: int = 0  # the answer had begun: ended with an error event, or cut
    answered: int = 0  # answered after the generation's stop order (e.g. within its grace)
    open: int = 0  # still under way when the figures were read

    @property
    def in_flight(self) -> int:
        """Every request that was under way at this generation when it went."""
        return self.failed + self.cut + self.answered + self.open


GENS_KEPT = 16  # generations whose figures are kept (a few per restart)


class GenBook(dict[int | None, GenFigures]):
    """The figures of the newest GENS_KEPT engine generations; the gate's loop's."""

    def of(self, gen: int | None) -> GenFigures:
        """The figures of generation `gen`, made on first use (the oldest is dropped)."""
        got = self.get(gen)
        if got is None:
            got = self[gen] = GenFigures()
            while len(self) > GENS_KEPT:
                del self[next(iter(self))]
        return got

    def settled(self, gen: int | None, still_open: int) -> GenFigures:
        """A copy of `gen`'s figures, with the exchanges still open counted now."""
        return dataclasses.replace(self.get(gen) or GenFigures(), open=still_open)
