"""Pure: the drain before a planned restart, phase by phase, as a function of time.

A load balancer learns that an instance is going away only from its health check: after
/readyz turns 503 it keeps sending requests for up to `interval x fall` seconds. So a planned
restart (leak, reload, SIGUSR1) runs three phases before the child is gone:

    deregistering  /readyz is 503; new requests may still arrive; wait drain.deregister_delay
    draining       wait until no request is running or waiting, at most restart.drain_timeout
    stopping       SIGTERM sent (vLLM >= 0.18 also drains itself: --shutdown-timeout)

Unplanned restarts (crash, hang, stall, failed health) skip the first two: a dead or stuck
engine finishes nothing, and the balancer's own checks already fail on it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum


class Phase(str, Enum):
    """Where a drain is; the value is what /status and the metrics show."""

    DEREGISTERING = "deregistering"
    DRAINING = "draining"
    STOPPING = "stopping"

    def __str__(self) -> str:
        return self.value


PHASES = tuple(Phase)


class Verdict(str, Enum):
    """What the ladder should do after a look at the drain."""

    WAIT = "wait"  # keep the child; look again at Drain.next_check
    STOP_IDLE = "stop_idle"  # nothing in flight: SIGTERM now
    STOP_TIMEOUT = "stop_timeout"  # drain_timeout ran out with requests still in flight


@dataclass(frozen=True)
class Drain:
    """One drain: when each phase began (None: not yet), and its two deadlines."""

    started: float
    deregister_until: float
    drain_until: float
    stopping_at: float | None = None
    exited_at: float | None = None


def plan(drain_asked: bool, child_ready: bool, deregister_delay: float,
         drain_timeout: float) -> tuple[float, float]:
    """(deregister, drain) seconds to spend before SIGTERM; (0, 0) where they cannot help.

    Only a planned restart of a child that was READY (so a balancer may route to it) waits.
    """
    if not drain_asked or not child_ready:
        return 0.0, 0.0
    return max(0.0, deregister_delay), max(0.0, drain_timeout)


def begin(now: float, deregister_delay: float, drain_timeout: float) -> Drain:
    """Start a drain at `now` (the moment /readyz turns 503)."""
    until = now + max(0.0, deregister_delay)
    return Drain(started=now, deregister_until=until, drain_until=until + max(0.0, drain_timeout))


def phase(d: Drain, now: float) -> Phase:
    """The phase at `now`."""
    if d.stopping_at is not None:
        return Phase.STOPPING
    return Phase.DEREGISTERING if now < d.deregister_until else Phase.DRAINING


def decide(d: Drain, now: float, running: float | None, waiting: float | None) -> Verdict:
    """After a /metrics scrape (or at a deadline): keep waiting, or stop the child.

    In-flight counts are ignored while deregistering: the balancer may still send new
    requests, so an idle moment then says nothing. Unknown counts (no scrape) never mean idle.
    """
    if d.stopping_at is not None or now < d.deregister_until:
        return Verdict.WAIT
    if running is not None and waiting is not None and running + waiting <= 0:
        return Verdict.STOP_IDLE
    return Verdict.STOP_TIMEOUT if now >= d.drain_until else Verdict.WAIT


def first_check(d: Drain, now: float) -> float:
    """The first look: when deregistering ends, at once where there is none (an idle child
    is then stopped without waiting a poll interval for nothing, issue 28)."""
    return max(now, d.deregister_until)


def next_check(d: Drain, now: float, poll: float) -> float:
    """When to look next: the end of deregistering, then every `poll`, never past the deadline."""
    if now < d.deregister_until:
        return d.deregister_until
    return min(now + poll, max(d.drain_until, now))


def deadline(d: Drain) -> float:
    """The latest moment the child may still be running before SIGTERM."""
    return d.drain_until


def stopping(d: Drain, now: float) -> Drain:
    """SIGTERM was sent at `now`."""
    return d if d.stopping_at is not None else replace(d, stopping_at=now)


def exited(d: Drain, now: float) -> Drain:
    """The child is gone at `now`."""
    return d if d.exited_at is not None else replace(d, exited_at=now)


def durations(d: Drain, now: float) -> dict[str, float]:
    """Seconds spent in each phase so far (a running phase counts up to `now`)."""
    stop = d.stopping_at if d.stopping_at is not None else now
    dereg_end = min(d.deregister_until, stop)
    out = {str(Phase.DEREGISTERING): max(0.0, dereg_end - d.started),
           str(Phase.DRAINING): max(0.0, stop - dereg_end)}
    if d.stopping_at is not None:
        end = d.exited_at if d.exited_at is not None else now
        out[str(Phase.STOPPING)] = max(0.0, end - d.stopping_at)
    return {k: round(v, 3) for k, v in out.items()}
