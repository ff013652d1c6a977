"""vLLM saying that a signal vllmwatch did not send started its shutdown ends a serving run
at once, as `crash` (core/serving.py _told): between that line and the exit its server goes
away, and with --api-server-count 2 the launcher waits up to vLLM's shutdown timeout before
it exits, long enough for three refused /health probes to restart it as `health`
("connection refused": a real vLLM 0.32 on CPU, tests/e2e/test_real_vllm.py). A line of an
older child's, or one read while vllmwatch itself stops its child, starts nothing."""

from __future__ import annotations

from tests.loop.test_machine import BASE, ready, restarts, up
from vllmwatch.core.events import ChildOutput, RestartRequested
from vllmwatch.core.policy import outside_stop
from vllmwatch.core.state import S
from vllmwatch.testing.driver import Driver, config_with

TOLD = "Waiting up to 30 seconds for processes to exit"


def _told(d: Driver, pid: int | None = None) -> None:
    child = d.state.child
    assert child is not None and child.pid is not None
    d.send(ChildOutput(told_to_stop=TOLD, pid=child.pid if pid is None else pid))


def test_the_line_while_serving_restarts_at_once_as_crash() -> None:
    d = up()
    _told(d)
    assert restarts(d) == ["crash"], d.events("restart.begin")
    detail = str(d.events("restart.begin")[0]["detail"])
    assert detail.startswith(outside_stop(TOLD)), detail
    assert "restarted without waiting for its exit" in detail, detail
    assert d.events("probe.failed") == []  # no probe had to fail first
    assert d.run_until(lambda: ready(d), 300)  # its exit, one vllmwatch asked for by then,
    assert restarts(d) == ["crash"]  # starts no second restart


def test_a_line_of_another_process_starts_nothing() -> None:
    d = up()
    child = d.state.child
    assert child is not None and child.pid is not None
    _told(d, pid=child.pid + 1000)
    d.run_for(30)
    assert restarts(d) == [] and d.state.state == S.READY


def test_the_line_while_starting_is_left_to_the_exit() -> None:
    d = Driver(BASE)
    assert d.run_until(lambda: d.state.state == S.STARTING and d.state.child is not None
                       and d.state.child.pid is not None, 60)
    _told(d)
    assert restarts(d) == [] and d.state.state == S.STARTING
    d.kill_child(0)  # (the exit's own detail: ChildExited.told_to_stop, core/policy.py)
    assert d.run_until(lambda: bool(restarts(d)), 60)
    assert restarts(d) == ["crash"], d.events("restart.begin")


def test_the_line_of_a_stop_vllmwatch_asked_for_starts_nothing() -> None:
    d = up(config_with(BASE, restart={"drain_timeout": 30}))
    d.send(RestartRequested())  # a planned restart: draining, then vllmwatch's own SIGTERM
    assert d.state.state != S.READY
    _told(d)
    assert restarts(d) == ["manual"], d.events("restart.begin")
