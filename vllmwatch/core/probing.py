"""Pure: starting probes and samples, their timers, and the freshness guard.

Every probe the core starts comes back as exactly one result (the shell guarantees it; see
events.failure_result). The freshness guard is the second line: while READY, each probe kind
must have completed within a bound derived from its interval and timeout, or the daemon says
so and stops vouching for itself to systemd's watchdog.
"""

from __future__ import annotations

from dataclasses import replace

from vllmwatch.core import sleep
from vllmwatch.core.events import Action, Log, Probe, SampleMemory
from vllmwatch.core.names import PROBES, ProbeKind
from vllmwatch.core.state import Result, S, WatchState

STARTUP_POLL = 1.0  # how often /health is asked while starting
DRAIN_POLL = 1.0
K = ProbeKind
FRESH_SLACK = 10.0  # added to every freshness bound: thread-pool queueing, a slow scrape


def start(s: WatchState, kind: ProbeKind, now: float) -> Result:
    """Start a probe against the current child unless one of that kind is in flight."""
    c = s.child
    if c is None or c.pid is None or kind in c.inflight:
        return s, []
    v = c.vllm
    act = Probe(kind, c.gen, v.host, v.port, v.model_name, s.config.probe, c.canary_kind)
    return replace(s, child=replace(s.run, inflight=c.inflight | {kind})), [act]


def landed(s: WatchState, kind: ProbeKind, gen: int, now: float) -> WatchState:
    """A result of this kind arrived: clear in-flight (for its own generation only)."""
    c = s.child
    if c is None or c.gen != gen:
        return s
    return replace(s, child=replace(c, inflight=c.inflight - {kind},
                                    probe_done_at={**c.probe_done_at, kind: now}))


def set_timer(s: WatchState, kind: ProbeKind, at: float) -> WatchState:
    """Schedule a probe kind for the current child."""
    assert s.child is not None
    return replace(s, child=replace(s.run, timers={**s.child.timers, kind: at}))


def fire(s: WatchState, kind: ProbeKind, now: float) -> Result:
    """A probe timer is due: reschedule it and start the probe."""
    p = s.config.probe
    if kind == K.HEALTH:
        wait = p.interval if s.state == S.READY else STARTUP_POLL
        return start(set_timer(s, K.HEALTH, now + wait), K.HEALTH, now)
    if kind == K.CANARY:
        s = set_timer(s, K.CANARY, now + p.canary_interval)
        c = s.child
        assert c is not None
        if s.state != S.READY:
            return s, []
        if not sleep.send_canary(c.asleep):  # asleep on purpose: nothing to prove
            return replace(s, child=replace(c, probe_done_at={**c.probe_done_at,
                                                              K.CANARY: now})), []
        if K.CANARY not in c.inflight:  # busy-or-hung compares against this point
            s = replace(s, child=replace(s.run, canary_ref=c.progress, canary_asleep=c.asleep))
        return start(s, K.CANARY, now)
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
    timers = {**c.timers, K.MEMORY: now + m.sample_interval}
    pss_due = now >= c.timers.get(K.PSS, 0.0)
    if pss_due:
        timers[K.PSS] = now + m.pss_interval
    s = replace(s, child=replace(s.run, timers=timers))
    if K.MEMORY in c.inflight or c.pid is None:
        return s, []
    gpus = tuple(c.vllm.gpus) if c.vllm.gpus is not None else None
    s = replace(s, child=replace(s.run, inflight=c.inflight | {K.MEMORY}))
    return s, [SampleMemory(pss_due, c.gen, gpus)]


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
    c = s.child
    if s.state != S.READY or c is None:
        return s, []
    stale = tuple(sorted(k for k, bound in bounds(s).items()
                         if now - c.probe_done_at.get(k, now) > bound))
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
    return replace(s, child=replace(s.run, stale=stale)), acts


def next_due(s: WatchState) -> float | None:
    """The earliest probe timer, or the next freshness bound, of the current child."""
    c = s.child
    if c is None:
        return None
    times = [t for k, t in c.timers.items() if not PROBES[k].timer_only]
    if s.state == S.READY:
        times += [c.probe_done_at.get(k, s.since) + b + 0.001 for k, b in bounds(s).items()
                  if k not in c.stale]
    return min(times) if times else None
