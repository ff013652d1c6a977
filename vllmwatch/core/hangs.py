"""Pure: how long a canary may take, and whether an engine that does not answer is hung or slow.

Issue 24. A fixed 30 s canary timeout sees a hang late; a short fixed one restarts a loaded
engine. So the timeout follows this model's own canary latencies (a high percentile of the
last `HISTORY` successes times `probe.canary_timeout_margin`, kept between
`probe.canary_timeout_min` and `probe.canary_timeout`), and a timeout is never a verdict by
itself: the engine's token counters and the host's CPU pressure decide (`on_timeout`).
docs/operations/incidents.md "How long a hang takes to see" has the resulting table of waits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from vllmwatch.config.schema import ProbeConfig

HISTORY = 32  # canary latencies kept per child run: ~1 min at the 2 s default interval
PERCENTILE = 0.95
RETRY_FACTOR = 2.0  # a timed-out canary is sent again with this much more time ...
STARVED_FACTOR = 4.0  # ... or this much when the host's CPUs are saturated
VERDICT_SPAN = 1.0  # the two scrapes a timeout is judged on are at least this far apart
FROZEN_STARVED_FACTOR = 3.0  # probe.progress_timeout is stretched so on a saturated host
# Saturated host: PSI says some runnable task waited for a CPU this share of the last 10 s,
# or (no PSI: old kernels, some containers) the 1-minute load average per CPU reaches this.
PSI_SATURATED = 40.0
LOAD_SATURATED = 1.0


@dataclass(frozen=True)
class HostCpu:
    """The host's CPU pressure as the shell read it at a scrape (None: not readable)."""

    psi_some_avg10: float | None = None  # /proc/pressure/cpu, percent
    load_per_cpu: float | None = None  # 1-minute load average / CPUs


def saturated(cpu: HostCpu | None) -> bool:
    """True when the host's CPUs are saturated: slow answers then prove nothing."""
    if cpu is None:
        return False
    if cpu.psi_some_avg10 is not None:
        return cpu.psi_some_avg10 >= PSI_SATURATED
    return cpu.load_per_cpu is not None and cpu.load_per_cpu >= LOAD_SATURATED


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (q in (0, 1]) of a non-empty series."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def remember(history: tuple[float, ...], seconds: float) -> tuple[float, ...]:
    """Add one successful canary's latency; keep the last HISTORY."""
    return (*history, seconds)[-HISTORY:]


def canary_timeout(p: ProbeConfig, history: Sequence[float]) -> float:
    """The timeout of the next canary: derived from this run's latencies, within the bounds.

    With no latency yet (the start), the ceiling `probe.canary_timeout`: the first request
    of a fresh engine may be slow, and nothing is known about this model yet.
    """
    if not history:
        return p.canary_timeout
    derived = percentile(history[-HISTORY:], PERCENTILE) * p.canary_timeout_margin
    return min(p.canary_timeout, max(_floor(p), derived))


def _floor(p: ProbeConfig) -> float:
    # A ceiling set below the floor (an older config's canary_timeout = "1s") wins: the
    # timeout is then fixed, as it was before issue 24.
    return min(p.canary_timeout_min, p.canary_timeout)


def retry_timeout(p: ProbeConfig, timed_out_after: float, starved: bool) -> float:
    """The timeout of the canary sent again after one timed out: longer, never past the ceiling."""
    factor = STARVED_FACTOR if starved else RETRY_FACTOR
    return min(p.canary_timeout, max(_floor(p), timed_out_after * factor))


class Verdict(str, Enum):
    """What a canary timeout means, once the counters and the host have been looked at."""

    HANG = "hang"  # restart now
    BUSY = "busy"  # the engine works (tokens, gauges): load, never a hang; ask again, longer
    RETRY = "retry"  # nothing moved, but one timeout is not proof yet: ask again, longer


def on_timeout(moved: bool, retried: bool, busy_for: float = 0.0,
               busy_limit: float = math.inf) -> Verdict:
    """The verdict on a canary timeout (table in docs/operations/incidents.md).

    `moved`: anything the engine reports moved since the canary was sent (policy.moved:
    tokens, queue sizes, KV-cache usage; False when /metrics failed). `retried`: the canary
    that timed out was already the longer retry. A saturated host only lengthens the retry
    (retry_timeout); the verdict itself stays the same. `busy_for`: how long canaries have
    gone unanswered while excused as busy; vLLM's own counters are not trusted past
    `busy_limit` (probe.busy_timeout, issue 37.8): an API server wedged while its engine
    runs shows moving tokens for ever, and no client gets an answer.
    """
    if moved:
        return Verdict.HANG if busy_for >= busy_limit else Verdict.BUSY
    return Verdict.HANG if retried else Verdict.RETRY


def frozen_limit(p: ProbeConfig, cpu: HostCpu | None) -> float:
    """How long queued work may see no counter or gauge move before it is a hang."""
    return p.progress_timeout * (FROZEN_STARVED_FACTOR if saturated(cpu) else 1.0)
