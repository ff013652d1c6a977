"""Pure: starting probes and samples, their timers, and the freshness guard.

Every probe the core starts comes back as exactly one result (the shell guarantees it; see
events.failure_result). The freshness guard is the second line: while READY, each probe kind
must have completed within a bound derived from its interval and timeout, or the daemon says
so and stops vouching for itself to systemd's watchdog.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from vllmwatch.config.schema import Config
from vllmwatch.core.actions import Action, Log, Probe, SampleMemory
from vllmwatch.core.events import CanaryResult, HealthResult, MemorySampled, MetricsResult
from vllmwatch.core.names import PROBES, ProbeKind
from vllmwatch.core.samples import MemorySample
from vllmwatch.core.state import Probes, Result, S, WatchState

STARTUP_POLL = 1.0  # how often /health is asked while starting
DRAIN_POLL = 1.0
K = ProbeKind
FRESH_SLACK = 10.0  # added to every freshness bound: thread-pool queueing, a slow scrape


def start(s: WatchState, kind: ProbeKind, now: float, canary_timeout: float | None = None
          ) -> Result:
    """Start a probe against the current child unless one of that kind is in flight.

    `canary_timeout` replaces probe.canary_timeout for this one request (core/hangs.py).
    """
    c = s.child
    if c is None or c.pid is None or kind in c.probes.inflight:
        return s, []
    v, p = c.vllm, s.config.probe
    if canary_timeout is not None:
        p = replace(p, canary_timeout=canary_timeout)
    act = Probe(kind, c.gen, v.host, v.port, v.model_name, p, c.canary.kind)
    return _with(s, replace(s.run.probes, inflight=c.probes.inflight | {kind})), [act]


def _with(s: WatchState, probes: Probes) -> WatchState:
    """The current child with this Probes record (this module owns it)."""
    return replace(s, child=replace(s.run, probes=probes))


def landed(s: WatchState, kind: ProbeKind, gen: int, now: float) -> WatchState:
    """A result of this kind arrived: clear in-flight (for its own generation only)."""
    c = s.child
    if c is None or c.gen != gen:
        return s
    return _with(s, replace(c.probes, inflight=c.probes.inflight - {kind},
                            done_at={**c.probes.done_at, kind: now}))


def vouched(s: WatchState, kind: ProbeKind, now: float) -> WatchState:
    """Count a kind as fresh without a result: a canary not sent on purpose (asleep)."""
    return _with(s, replace(s.run.probes, done_at={**s.run.probes.done_at, kind: now}))


def set_timer(s: WatchState, kind: ProbeKind, at: float) -> WatchState:
    """Schedule a probe kind for the current child."""
    assert s.child is not None
    return _with(s, replace(s.run.probes, timers={**s.child.probes.timers, kind: at}))


def serving(s: WatchState, now: float) -> WatchState:
    """The child became READY: every serving probe's timer, all fresh, none stale."""
    p = s.config.probe
    timers = {K.HEALTH: now + p.interval, K.CANARY: now + p.canary_interval,
              K.METRICS: now, K.MEMORY: now}
    return _with(s, replace(s.run.probes, timers=timers, done_at={k: now for k in bounds(s)},
                            stale=()))


# Each timer's cadence in the config (a reload may shorten it: recadenced)
CADENCE: dict[ProbeKind, Callable[[Config], float]] = {
    K.HEALTH: lambda c: c.probe.interval, K.CANARY: lambda c: c.probe.canary_interval,
    K.METRICS: lambda c: c.probe.metrics_interval, K.MEMORY: lambda c: c.memory.sample_interval,
    K.PSS: lambda c: c.memory.pss_interval}


def recadenced(s: WatchState, old: Config, now: float) -> WatchState:
    """A reload took s.config over `old`: a timer the old cadence set comes no later than the
    new cadence from now, and a freshness bound that shrank counts from now (a kind already
    stale stays so). The bounds follow the config at once: probe.interval 10m -> 1s read the
    health probe stale until its old timer fired, and systemd's watchdog killed us."""
    c = s.child
    if c is None:
        return s
    pr = c.probes
    timers = {kind: min(at, now + CADENCE[kind](s.config))
              if kind in CADENCE and CADENCE[kind](s.config) < CADENCE[kind](old) else at
              for kind, at in pr.timers.items()}
    was, bound = bounds(replace(s, config=old)), bounds(s)
    done_at = {kind: max(at, now) if kind in bound and bound[kind] < was[kind]
               and kind not in pr.stale else at for kind, at in pr.done_at.items()}
    return _with(s, replace(pr, timers=timers, done_at=done_at))


def sampled(s: WatchState, sample: MemorySample) -> WatchState:
    """Keep the last memory sample (the release gate reads its tree pids)."""
    return _with(s, replace(s.run.probes, memory=sample))


def forget(s: WatchState) -> WatchState:
    """The old tree is swept: nothing in flight, nothing due, no sample of it."""
    return _with(s, replace(s.run.probes, inflight=frozenset(), timers={}, memory=None))


def fire(s: WatchState, kind: ProbeKind, now: float) -> Result:
    """A probe timer is due: reschedule it and start the probe."""
    p = s.config.probe
    if kind == K.HEALTH:
        wait = p.interval if s.state == S.READY else STARTUP_POLL
        return start(set_timer(s, K.HEALTH, now + wait), K.HEALTH, now)
    if kind == K.METRICS:
        wait = DRAIN_POLL if s.state == S.DRAINING else p.metrics_interval
        return start(set_timer(s, K.METRICS, now + wait), K.METRICS, now)
    if kind == K.MEMORY:
        return sample_memory(s, now)
    return s, []


def sample_memory(s: WatchState, now: float) -> Result:
    """Sample the child tree's memory; PSS at its own, slower cadence."""
    m = s.config.memory
    c = s.child
    assert c is not None
    pr = c.probes
    timers = {**pr.timers, K.MEMORY: now + m.sample_interval}
    pss_due = now >= pr.timers.get(K.PSS, 0.0)
    if pss_due:
        timers[K.PSS] = now + m.pss_interval
    s = _with(s, replace(pr, timers=timers))
    if K.MEMORY in pr.inflight or c.pid is None:
        return s, []
    gpus = tuple(c.vllm.gpus) if c.vllm.gpus is not None else None
    s = _with(s, replace(s.run.probes, inflight=pr.inflight | {K.MEMORY}))
    return s, [SampleMemory(pss_due, c.gen, gpus, c.proc.gpu_before_mib)]


def bounds(s: WatchState) -> dict[ProbeKind, float]:
    """How long each guarded probe kind (names.GUARDED_PROBES) may go without a result while
    READY."""
    p, m = s.config.probe, s.config.memory
    return {
        K.HEALTH: 2 * p.interval + p.timeout + FRESH_SLACK,
        K.CANARY: 2 * p.canary_interval + p.canary_timeout + FRESH_SLACK,
        K.METRICS: 2 * p.metrics_interval + p.timeout + FRESH_SLACK,
        K.MEMORY: 2 * m.sample_interval + FRESH_SLACK,
    }


def freshness(s: WatchState, now: float) -> Result:
    """Mark the probe kinds whose results are overdue; log a kind when it turns stale, and
    once when all are fresh again.

    After a jump of the clock (a suspended VM) every kind is overdue at once and then comes
    back one by one: a kind coming back is not news, and it must not repeat the alarm.
    """
    if s.state != S.READY or s.child is None:
        return s, []
    c = s.child.probes
    stale = tuple(sorted(k for k, bound in bounds(s).items()
                         if now - c.done_at.get(k, now) > bound))
    if stale == c.stale:
        return s, []
    acts: list[Action] = []
    new = [k for k in stale if k not in c.stale]
    if new:
        acts.append(Log("error", "watchdog.probe_stale", {
            "probes": new, "stale": list(stale), "detail": "no result within the bound; "
            "vllmwatch stops sending WATCHDOG=1 so that systemd's watchdog takes over"}))
    elif not stale:
        acts.append(Log("info", "watchdog.probe_fresh", {"probes": list(c.stale)}))
    return _with(s, replace(c, stale=stale)), acts


def next_due(s: WatchState) -> float | None:
    """The earliest probe timer, or the next freshness bound, of the current child."""
    if s.child is None:
        return None
    c = s.child.probes
    times = [t for k, t in c.timers.items() if not PROBES[k].timer_only]
    if s.state == S.READY:
        times += [c.done_at.get(k, s.since) + b + 0.001 for k, b in bounds(s).items()
                  if k not in c.stale]
    return min(times) if times else None


def kind(ev: HealthResult | CanaryResult | MetricsResult | MemorySampled) -> ProbeKind:
    """Which probe a result answers."""
    if isinstance(ev, MemorySampled):
        return ProbeKind.MEMORY
    if isinstance(ev, MetricsResult):
        return ProbeKind.METRICS
    if isinstance(ev, HealthResult):
        return ProbeKind.HEALTH
    return ProbeKind.WARMUP if ev.warmup else ProbeKind.CANARY
