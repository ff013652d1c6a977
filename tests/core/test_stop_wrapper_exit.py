"""What outlives the vLLM command's process in a planned stop (pure core). The stop SIGTERMs
the leader alone (tests/core/test_stop_leader.py); a wrapper that does not exec vLLM (`sh -c
'vllm serve ...; :'`) died of it and passed nothing on, and the sweep SIGKILLed vLLM 3 s
later, cutting every request in flight. The sweep now passes the SIGTERM on to what is left
of the leader's group and gives it the rest of the drain window (Sweep.pass_on), never past
restart.stop_timeout; a second stop signal SIGKILLs at once."""

from __future__ import annotations

import pytest

from tests.core.test_stop_leader import _ready, _signals
from vllmwatch.core import ladder
from vllmwatch.core.actions import Action, SignalGroup, Sweep
from vllmwatch.core.events import ChildExited, RestartRequested, StopRequested
from vllmwatch.core.names import Reason
from vllmwatch.core.state import S
from vllmwatch.core.stopping import SETTLE, SWEEP_WAIT


def _sweep(acts: list[Action]) -> Sweep:
    sweeps = [a for a in acts if isinstance(a, Sweep)]
    assert len(sweeps) == 1, acts
    return sweeps[0]


@pytest.mark.parametrize("reason", [Reason.STOP, Reason.MANUAL, Reason.RELOAD,
                                    Reason.GPU_MEMORY, Reason.HEALTH])
def test_the_leaders_exit_passes_the_sigterm_on_for_the_drain_window(reason: Reason) -> None:
    core = _ready(drain=10.0, stop=30.0)
    core.s, _ = ladder.begin_restart(core.s, core.now, reason, "test", drain=False)
    pid = core.s.pid
    assert pid is not None and core.s.state == S.STOPPING
    acts = core.step(ChildExited(pid, None, "SIGTERM"), 0.5)  # the wrapper died of it
    sweep = _sweep(acts)
    assert sweep.pass_on == pytest.approx(10.0 + SETTLE - 0.5)  # the window from the SIGTERM
    assert sweep.settle == SETTLE  # for what is not in its group (a setsid'd descendant)
    assert core.s.state == S.CLEANUP


def test_the_window_never_outlasts_the_stop_timeout() -> None:
    core = _ready(drain=30.0, stop=8.0)
    core.step(StopRequested("SIGTERM"), 0.0)
    pid = core.s.pid
    assert pid is not None
    acts = core.step(ChildExited(pid, None, "SIGTERM"), 2.0)
    sweep = _sweep(acts)
    assert sweep.pass_on == pytest.approx(6.0)  # the SIGKILL at restart.stop_timeout
    assert core.s.deadline == pytest.approx(core.now + 6.0 + SWEEP_WAIT)  # (the way out)


def test_once_the_group_had_its_sigterm_nothing_is_passed_on() -> None:
    core = _ready(drain=5.0, stop=30.0)
    core.step(StopRequested("SIGTERM"), 0.0)
    acts = core.step(RestartRequested(), 5.0 + SETTLE)  # the group's SIGTERM
    assert _signals(acts) == [SignalGroup("SIGTERM")]
    pid = core.s.pid
    assert pid is not None
    sweep = _sweep(core.step(ChildExited(pid, None, "SIGTERM"), 1.0))
    assert sweep.pass_on == 0.0 and sweep.settle == SETTLE


def test_a_second_stop_signal_sigkills_what_is_left_draining() -> None:
    core = _ready(drain=10.0, stop=30.0)
    core.step(StopRequested("SIGTERM"), 0.0)
    pid = core.s.pid
    assert pid is not None
    core.step(ChildExited(pid, None, "SIGTERM"), 0.5)
    acts = core.step(StopRequested("SIGTERM"), 1.0)
    assert _signals(acts) == [SignalGroup("SIGKILL")]
    assert core.events("child.kill")


def test_a_stop_during_a_restarts_drain_waits_for_it_then_leaves() -> None:
    """A restart's sweep has no deadline; the stop that comes during it gives the sweep the
    rest of the window before leaving without confirmation (not SWEEP_WAIT alone)."""
    core = _ready(drain=10.0, stop=30.0)
    begun = core.now
    core.s, _ = ladder.begin_restart(core.s, begun, Reason.MANUAL, "SIGUSR1", drain=False)
    pid = core.s.pid
    assert pid is not None
    core.step(ChildExited(pid, None, "SIGTERM"), 0.5)
    assert core.s.deadline is None
    acts = core.step(StopRequested("SIGTERM"), 1.0)
    assert not _signals(acts)  # the first stop signal lets it drain
    assert core.s.deadline == pytest.approx(begun + 10.0 + SETTLE + SWEEP_WAIT)
