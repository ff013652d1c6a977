"""The seconds around a launch (issue 28 §3), with the pure core and a fake world."""

from __future__ import annotations

from vllmwatch.config.schema import from_dict
from vllmwatch.core.events import ReadyzPolled, RestartRequested, StopRequested
from vllmwatch.core.state import S
from vllmwatch.testing.driver import Driver, World, config_with

BASE = from_dict({
    "vllm": {"model": "/m", "gpus": []},
    "probe": {"interval": 5, "canary_interval": 60, "canary_timeout": 30},
    "restart": {"backoff_initial": 5, "backoff_max": 60, "backoff_jitter": 0.0,
                "stop_timeout": 30, "stable_after": 600},
    "startup": {"timeout": 100, "stall_timeout": 1000},
    "prewarm": {"enabled": False},
    "drain": {"deregister_delay": 0},
})


def test_the_first_crash_after_a_stable_run_relaunches_without_backoff() -> None:
    d = Driver(BASE)
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    d.run_for(700)  # a stable run
    d.kill_child(code=1)
    assert d.state.state == S.STARTING and d.world.spawns == 2
    assert d.events("restart.backoff") == []
    d.kill_child(code=1)  # the second failure in a row waits out the backoff
    assert d.state.state == S.BACKOFF
    assert d.events("restart.backoff")[-1]["delay_s"] == 5.0


def test_a_start_that_never_served_gets_the_short_grace() -> None:
    d = Driver(BASE, world=World(canary_ok=False, ignore_sigterm=True))
    d.run_for(101)  # startup.timeout
    assert [f["reason"] for f in d.events("restart.begin")] == ["start_timeout"]
    assert d.events("child.stopping")[-1]["grace_s"] == 5.0


def test_a_stop_while_starting_gets_the_short_grace() -> None:
    d = Driver(BASE, world=World(canary_ok=False, ignore_sigterm=True))
    d.run_for(3)
    assert d.state.state == S.STARTING
    d.send(StopRequested("SIGTERM"))
    assert d.events("child.stopping")[-1]["grace_s"] == 5.0
    d.run_for(6)
    assert d.world.signals == ["SIGTERM", "SIGKILL"]


DRAINS = config_with(BASE, drain={"deregister_delay": 10}, restart={"drain_timeout": 30})


def _sigusr1_deregister(d: Driver) -> float:
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    d.send(RestartRequested())
    return float(d.events("drain.begin")[-1]["deregister_delay_s"])


def test_the_deregister_delay_is_skipped_when_nothing_polls_readyz() -> None:
    d = Driver(DRAINS)
    d.send(ReadyzPolled(polled=False))  # the daemon reports polls; none come
    assert _sigusr1_deregister(d) == 0.0


def test_a_balancer_polling_readyz_gets_the_deregister_delay() -> None:
    d = Driver(DRAINS)
    d.send(ReadyzPolled(polled=False))
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    d.run_for(30)
    d.send(ReadyzPolled())  # 30 s before the restart: inside the 60 s window
    d.run_for(30)
    assert _sigusr1_deregister(d) == 10.0


def test_a_poll_long_ago_is_no_balancer() -> None:
    d = Driver(DRAINS)
    d.send(ReadyzPolled())
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    d.run_for(61)
    assert _sigusr1_deregister(d) == 0.0


def test_without_poll_reports_the_delay_is_kept() -> None:
    assert _sigusr1_deregister(Driver(DRAINS)) == 10.0  # the gate on, or a bare Loop
