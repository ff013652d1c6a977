"""A rung that waits on a worker's one answer (the sweep, the GPU release wait, pre-warm)
and never gets it (NVML or /proc stuck in the kernel) no longer lets vllmwatch vouch for
itself: OVERDUE_S past the worker's own bound, WATCHDOG=1 is withheld and the start's timeout
no longer extended, so systemd's watchdog or start timeout restarts the service (a hostile
review: a day later the core still sat on the rung and vouched)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vllmwatch.config.schema import Config
from vllmwatch.core import machine, restart
from vllmwatch.core.actions import Notify
from vllmwatch.core.events import ChildExited, Event, Spawned, SweepDone, Tick
from vllmwatch.core.failover import BUILD_TIMEOUT
from vllmwatch.core.restart import OVERDUE_S, SWEEP_S, Phase


def _cfg(prewarm: bool) -> Config:
    c = Config()
    return replace(c, incidents=replace(c.incidents, enabled=False),
                   prewarm=replace(c.prewarm, enabled=prewarm))


def _to(case: str) -> tuple[machine.WatchState, float, float]:
    """(state, now, the rung's bound) with the rung's worker owing its answer."""
    s = machine.initial(_cfg(case == "prewarm"), 0.0)
    steps: list[tuple[Event, float]] = [(Tick(), 0.0), (SweepDone((), (), None), 0.1)]
    if case != "prewarm":
        steps += [(Spawned(4242), 0.2), (ChildExited(4242, 1, None), 5.0)]
    if case == "release":
        steps.append((SweepDone((4243,), (), None), 5.5))
    for ev, t in steps:
        s, _ = machine.step(s, ev, t)
    bound = {"sweep": SWEEP_S, "release": s.config.restart.gpu_release_timeout,
             "prewarm": s.config.prewarm.timeout}[case]
    return s, steps[-1][1], bound


@pytest.mark.parametrize(("case", "phase"), [("sweep", Phase.SWEEPING),
                                             ("release", Phase.RELEASE_WAIT),
                                             ("prewarm", Phase.PREWARMING)])
def test_a_rung_whose_worker_never_answers_stops_the_vouching(case: str, phase: Phase) -> None:
    s, now, bound = _to(case)
    assert s.restart.phase == phase
    extends: list[float] = []
    t = now
    while t < now + bound + OVERDUE_S + 60:
        t += 5.0
        s, acts = machine.step(s, Tick(), t)
        assert s.restart.phase == phase  # nobody answered: the rung stays
        extends += [t for a in acts if isinstance(a, Notify) and a.extend_usec]
        wake = machine.next_wakeup(s)
        assert wake is None or wake > t, "the loop would spin"
        within = t - s.restart.since <= bound + OVERDUE_S
        assert machine.watchdog_ok(s, t) is within, (t, s.restart.since)
    assert extends and max(extends) <= s.restart.since + bound + OVERDUE_S + 5.0
    assert machine.watchdog_ok(s)  # without a time, as before (the stale-probe rule only)


def test_the_spares_build_bound_is_the_one_failover_uses() -> None:
    assert restart.SPARE_BUILD_S == BUILD_TIMEOUT
