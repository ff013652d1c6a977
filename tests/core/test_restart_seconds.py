"""The seconds around a restart that no one needs (issue 28 item 3), on the pure core: a
planned restart of an idle child sends SIGTERM on its first look, not a poll later; a server
that says it listens is asked at once, not at the next start poll."""

from __future__ import annotations

import pytest

from tests.core.test_truthful_signals import Core
from vllmwatch.core import probing
from vllmwatch.core.actions import Probe, SignalGroup
from vllmwatch.core.events import ChildOutput, MetricsResult, ReadyzPolled, RestartRequested, Tick
from vllmwatch.core.names import ProbeKind
from vllmwatch.core.state import S


def _serving() -> Core:
    """A READY child; the shell reports /readyz polls (the status listener is on) and none
    came, so nothing can take us out of a balancer's rotation: no deregister delay."""
    core = Core()
    core.step(ReadyzPolled(polled=False), 0.0)
    core.launch()
    core.become_ready()
    core.step(MetricsResult(True, 0.01, running=0, waiting=0, gen=core.s.gen), 0.1)
    assert ProbeKind.METRICS not in core.s.run.probes.inflight  # no scrape under way
    return core


def test_an_idle_child_is_stopped_on_the_first_look_when_nothing_deregisters_us() -> None:
    core = _serving()
    acts = core.step(RestartRequested())
    assert core.s.state == S.DRAINING
    # The look is due now, not a DRAIN_POLL later: the step that began the drain scrapes.
    assert any(isinstance(a, Probe) and a.kind == ProbeKind.METRICS for a in acts)
    acts = core.step(MetricsResult(True, 0.01, running=0, waiting=0, gen=core.s.gen), 0.05)
    assert SignalGroup("SIGTERM", leader=True) in acts  # the API server drains, then stops
    assert core.events("drain.done")[-1]["after_s"] == pytest.approx(0.05, abs=0.01)


def test_a_busy_child_is_looked_at_again_every_poll_until_idle() -> None:
    core = _serving()
    core.step(RestartRequested())
    gen = core.s.gen
    acts = core.step(MetricsResult(True, 0.01, running=2, waiting=0, gen=gen), 0.05)
    assert not any(isinstance(a, SignalGroup) for a in acts)
    timers = core.s.run.probes.timers
    assert timers[ProbeKind.METRICS] == pytest.approx(core.now + probing.DRAIN_POLL)
    core.step(Tick(), probing.DRAIN_POLL)
    acts = core.step(MetricsResult(True, 0.01, running=0, waiting=0, gen=gen), 0.05)
    assert SignalGroup("SIGTERM", leader=True) in acts  # the API server drains, then stops


def test_with_a_balancer_watching_the_first_look_waits_for_the_deregistration() -> None:
    core = _serving()
    core.step(ReadyzPolled(), 0.5)  # a balancer polls /readyz
    begun = core.now + 1.0
    core.step(RestartRequested())
    delay = core.s.config.drain.deregister_delay
    assert delay > 0
    assert core.s.run.probes.timers[ProbeKind.METRICS] == pytest.approx(begun + delay)
    # An idle scrape during the deregistration stops nothing: new requests may still come.
    acts = core.step(MetricsResult(True, 0.01, running=0, waiting=0, gen=core.s.gen), 0.1)
    assert not any(isinstance(a, SignalGroup) for a in acts)


@pytest.mark.parametrize("milestone", ["api_ready"])
def test_health_is_asked_at_once_when_the_server_says_it_listens(milestone: str) -> None:
    core = Core()
    core.launch()
    core.step(Tick(), 0.0)
    core.step(Tick(), 0.3)  # between two start polls
    assert core.s.run.probes.timers[ProbeKind.HEALTH] > core.now + 0.5
    acts = core.step(ChildOutput(milestone), 0.0)
    assert any(isinstance(a, Probe) and a.kind == ProbeKind.HEALTH for a in acts)
    timers = core.s.run.probes.timers
    assert timers[ProbeKind.HEALTH] == pytest.approx(core.now + probing.STARTUP_POLL)


@pytest.mark.parametrize("milestone", ["weights", "compile", "graphs", "engine_init"])
def test_earlier_phases_leave_the_start_poll_alone(milestone: str) -> None:
    core = Core()
    core.launch()
    core.step(Tick(), 0.0)
    core.step(Tick(), 0.3)
    due = core.s.run.probes.timers[ProbeKind.HEALTH]
    acts = core.step(ChildOutput(milestone), 0.0)
    assert not any(isinstance(a, Probe) for a in acts)
    assert core.s.run.probes.timers[ProbeKind.HEALTH] == due
