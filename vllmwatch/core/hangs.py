"""Pure: how long a canary may take, and whether an engine that does not answer is hung or slow.

Issue 24. A fixed 30 s canary timeout sees a hang late; a short fixed one restarts a loaded
engine. So the timeout follows this model's own canary latencies (a high percentile of the
last `HISTORY` successes times `probe.canary_timeout_margin`, kept between
`probe.canary_timeout_min` and `probe.canary_timeout`), and a timeout is never a verdict by
itself: the engine's token counters and the host's CPU pressure decide (`on_timeout`).
docs/operations/incidents.md "How long a hang takes to see" has the resulting table of waits.

Two more answers to "hung?" live here: a start that printed nothing, busy or stuck by its
CPU use (`stall_hint`), and an engine asleep on purpose, never hung (`judge_canary`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

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


# --- a silent start: busy or stuck, from its CPU use (was core/stalls.py) --------------------
# Why a start made no progress: the vLLM tree's CPU use while nothing was printed.
#
# A start that prints nothing for `startup.stall_timeout` is restarted either way, but the
# operator's next step differs: a tree that burned a CPU meanwhile was busy without output
# (compiling, loading; the timeout may be too short for this box), one that used almost none
# was waiting or starved (a lock, a download, a hung collective, or another process spinning
# on the cores it is bound to). Memory samples carry the tree's CPU seconds; mark_cpu keeps
# the first and the latest reading since the last progress and stall_hint turns them into that
# hint.

Mark = tuple[float, float]  # (monotonic time, tree CPU seconds)

STALL_BUSY = 0.2  # share of one CPU above which a silent tree counts as busy
STALL_MIN_SPAN = 5.0  # seconds between readings below which no rate is given


def mark_cpu(marks: tuple[Mark, Mark] | None, last_progress: float, now: float,
             cpu_s: float) -> tuple[Mark, Mark]:
    """Record a reading: the first since the last progress starts a new span."""
    if marks is None or marks[0][0] < last_progress:
        return (now, cpu_s), (now, cpu_s)
    return marks[0], (now, cpu_s)


def cpu_share(marks: tuple[Mark, Mark] | None) -> tuple[float, float] | None:
    """(share of one CPU, seconds it covers) over the span, or None when it cannot say."""
    if marks is None:
        return None
    (t0, c0), (t1, c1) = marks
    span = t1 - t0
    # too short, or a process exited and took its CPU time
    if span < STALL_MIN_SPAN or c1 < c0:
        return None
    return (c1 - c0) / span, span


def stall_hint(marks: tuple[Mark, Mark] | None, last_progress: float) -> str:
    """The stall detail's tail: what the tree did meanwhile and what to look at ('' if unknown)."""
    if marks is None or marks[0][0] < last_progress:
        return ""
    got = cpu_share(marks)
    if got is None:
        return ""
    share, span = got
    used = f"; the vLLM tree used {100 * share:.0f}% of one CPU over the last {span:.0f}s"
    if share >= STALL_BUSY:
        return used + (": busy without output (compiling or loading?); if starts are this "
                       "slow here, raise startup.stall_timeout")
    return used + (": waiting or starved (a download, a lock, a hung collective, or another "
                   "process spinning on the CPUs it is bound to)")


class _Phases(Protocol):
    @property
    def phases(self) -> Mapping[str, float]: ...


class Launched(Protocol):
    """What got_to reads of core/state.ChildRun (a protocol: importing core/state here
    would close an import circle)."""

    @property
    def started(self) -> float: ...

    @property
    def start(self) -> _Phases: ...


def got_to(child: Launched | None, now: float) -> str:
    """A timed-out start's tail: the last milestone vLLM's output showed (weights, compile,
    kv_cache, graphs_start: shell/childlog.py) and when, so the restart names where the
    start stuck, not only that startup.timeout ran out ('' without a child)."""
    if child is None:
        return ""
    phases = child.start.phases  # seconds since the launch
    if not phases:
        return "; no start milestone in vLLM's output (still importing, or its log hides them)"
    last = max(phases, key=lambda k: phases[k])
    return (f"; its last start milestone: {last} at +{phases[last]:.0f}s, none in the "
            f"{max(0.0, now - child.started - phases[last]):.0f}s after")


# --- vLLM's sleep mode: asleep on purpose is not hung (was core/sleep.py) --------------------
# An engine put to sleep on purpose is not hung.
#
# With `--enable-sleep-mode`, `POST /sleep` frees the weights and KV cache; /health stays 200
# while completions are refused (or wait) until `POST /wake_up`. vLLM says so on /metrics:
# `vllm:engine_sleep_state{sleep_state="awake"}` is 1 when awake and 0 while asleep (one series
# per engine). A canary that fails or times out while asleep proves nothing about a hang, so
# while the last scrape said "asleep" the canary is not sent and its results are not judged.

SLEEP_SERIES = "vllm:engine_sleep_state"


def asleep_from_awake(awake_values: Iterable[float]) -> bool | None:
    """From the `awake` series of each engine: True if any engine sleeps, None if no series.

    None means this vLLM does not report sleep (an older version): judge as before.
    """
    values = list(awake_values)
    if not values:
        return None
    return any(v < 0.5 for v in values)


def send_canary(asleep: bool | None) -> bool:
    """Whether the periodic canary should be sent now."""
    return asleep is not True


def judge_canary(asleep_when_sent: bool | None, asleep_now: bool | None) -> bool:
    """Whether a canary failure or timeout may count toward a restart.

    Not if the engine slept when the canary left or sleeps now (it may have gone to sleep
    while the canary was in flight): in both cases the failure is the sleep, not a fault.
    """
    return asleep_when_sent is not True and asleep_now is not True


def judge_stall(asleep: bool | None) -> bool:
    """Whether "requests waiting but no token generated" may count as a stall."""
    return asleep is not True
