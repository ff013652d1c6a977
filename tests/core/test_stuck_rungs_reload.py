"""A reload during a rung that waits on a worker never makes that rung read stuck before its
own bound (a hostile review, 2026-12-07).

restart.stuck judged the GPU release wait and the pre-warm by the config in force now: a
SIGHUP lowering restart.gpu_release_timeout (600 s -> 30 s) during a release wait that then
ran to its own deadline (set when it began) withheld WATCHDOG=1 from 150 s in to its end, and
systemd's watchdog killed vllmwatch for a wait that was on time. The bound is the one in force
when the rung began."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vllmwatch.config.schema import Config
from vllmwatch.core import machine
from vllmwatch.core.events import (
    ChildExited,
    Event,
    ReleaseChecked,
    ReloadRequested,
    Spawned,
    SweepDone,
    Tick,
)
from vllmwatch.core.restart import OVERDUE_S, Phase

LONG, SHORT = 600.0, 30.0


def _cfg(case: str, timeout: float) -> Config:
    c = Config()
    c = replace(c, incidents=replace(c.incidents, enabled=False),
                prewarm=replace(c.prewarm, enabled=case == "prewarm"))
    if case == "prewarm":
        return replace(c, prewarm=replace(c.prewarm, timeout=timeout))
    return replace(c, restart=replace(c.restart, gpu_release_timeout=timeout))


@pytest.mark.parametrize(("case", "phase"), [("release", Phase.RELEASE_WAIT),
                                             ("prewarm", Phase.PREWARMING)])
def test_a_reload_shortening_the_bound_of_a_wait_under_way_keeps_its_own(
        case: str, phase: Phase) -> None:
    s = machine.initial(_cfg(case, LONG), 0.0)
    steps: list[tuple[Event, float]] = [(Tick(), 0.0), (SweepDone((), (), None), 0.1)]
    if case == "release":
        steps += [(Spawned(4242), 0.2), (ChildExited(4242, 1, None), 5.0),
                  (SweepDone((4243,), (), None), 5.5)]
    for ev, t in steps:
        s, _ = machine.step(s, ev, t)
    assert s.restart.phase == phase
    since = s.restart.since
    s, _ = machine.step(s, ReloadRequested(_cfg(case, SHORT)), since + 5)
    assert s.config.restart.gpu_release_timeout == SHORT or s.config.prewarm.timeout == SHORT
    t = since + 5
    while t < since + LONG - 5 and s.restart.phase == phase:
        t += 5.0
        if case == "release":  # the GPU look answers: still held, until its own deadline
            s, _ = machine.step(s, ReleaseChecked(False, "held"), t)
        s, _ = machine.step(s, Tick(), t)
        assert machine.watchdog_ok(s, t), f"withheld {t - since:.0f}s into a {LONG:g}s wait"
    if s.restart.phase == phase:  # its worker never answered: stuck past its own bound only
        assert not machine.watchdog_ok(s, since + LONG + OVERDUE_S + 1)
