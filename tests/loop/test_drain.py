"""Drains and the sleep rule through the real loop (Driver, fake clock): the deregistration
delay, in-flight requests, the drain timeout, and an engine asleep is not restarted."""

from __future__ import annotations

import pytest

from vllmwatch.config.schema import from_dict
from vllmwatch.core import machine
from vllmwatch.core.events import RestartRequested
from vllmwatch.core.state import S
from vllmwatch.testing.driver import Driver, World

# drain.deregister_delay=10, restart.drain_timeout=30, started at t=100


# ---- the drain through the real loop (Driver: fake clock, fake vLLM world) ----

CONFIG = from_dict({
    "vllm": {"model": "/m", "gpus": []},
    "restart": {"drain_timeout": 30, "stop_timeout": 30, "backoff_jitter": 0.0},
    "drain": {"deregister_delay": 10},
    "prewarm": {"enabled": False},
})


def serving(world: World | None = None) -> Driver:
    d = Driver(CONFIG, world=world)
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    return d


def sigterm_after(d: Driver, limit: float = 120) -> float:
    """Fake seconds from now until the loop sent SIGTERM."""
    t0 = d.clock.now
    assert d.run_until(lambda: "SIGTERM" in d.world.signals, limit)
    return d.clock.now - t0


def test_planned_restart_waits_the_deregistration_delay_even_when_idle() -> None:
    d = serving()
    d.send(RestartRequested())
    assert d.state.state == S.DRAINING and d.world.signals == []
    took = sigterm_after(d)
    assert 10.0 <= took <= 12.0
    done = d.events("drain.done")[-1]
    assert done["phases_s"]["deregistering"] == 10.0


def test_after_the_delay_in_flight_requests_finish_first() -> None:
    d = serving(World(running=2, waiting=1))
    d.send(RestartRequested())
    d.run_for(25)
    assert d.world.signals == [] and d.state.state == S.DRAINING
    d.world.running, d.world.waiting = 0, 0
    took = sigterm_after(d)
    assert took <= 2.0
    d.kill_child()
    assert d.run_until(lambda: d.state.last_drain != {}, 30)
    phases = d.state.last_drain
    assert phases["deregistering"] == 10.0 and phases["draining"] >= 15.0
    assert "stopping" in phases


def test_drain_timeout_bounds_the_wait_after_the_delay() -> None:
    d = serving(World(running=5))
    d.send(RestartRequested())
    took = sigterm_after(d)
    assert 39.0 <= took <= 41.0  # deregister_delay 10 + drain_timeout 30
    assert d.events("drain.timeout")


def test_a_crash_skips_the_drain() -> None:
    d = serving(World(running=5))
    d.kill_child(code=1)
    assert d.events("restart.begin")[-1]["reason"] == "crash"
    assert not d.events("drain.begin")
    assert d.run_until(lambda: d.state.state == S.READY, 120)


# ---- the sleep-state rule through the real loop ----

SLEEPY = from_dict({
    "vllm": {"model": "/m", "gpus": []},
    "probe": {"canary_interval": 60, "canary_timeout": 30, "metrics_interval": 15,
              "failure_threshold": 3, "stall_timeout": 120},
    "prewarm": {"enabled": False},
})


def restarts(d: Driver) -> list[str]:
    return [f["reason"] for f in d.events("restart.begin")]


@pytest.mark.parametrize("fault", ["timeout", "error"])
def test_an_engine_asleep_is_not_restarted(fault: str) -> None:
    d = Driver(SLEEPY, world=World(asleep=False))
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    d.world.asleep = True  # POST /sleep: completions fail or wait, /health stays 200
    d.world.canary_timeout = fault == "timeout"
    d.world.canary_ok = False
    d.run_for(30)  # a scrape sees it asleep
    assert d.events("vllm.sleep_state")[-1]["asleep"] is True
    sent = len([a for a in d.fx.logs if a.event == "probe.failed"])
    d.run_for(3600)
    assert restarts(d) == [] and d.state.state == S.READY
    assert len([a for a in d.fx.logs if a.event == "probe.failed"]) == sent
    assert machine.watchdog_ok(d.state)  # the skipped canary is not a stale probe
    d.world.asleep = False  # woken up, and still failing: now it counts
    d.run_for(600)
    assert restarts(d)[0] in ("hang", "health")


def test_a_canary_in_flight_when_it_fell_asleep_is_not_judged() -> None:
    d = Driver(SLEEPY, world=World(asleep=False))
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    d.run_for(55 - (d.clock.now - d.state.since))  # just before the first canary
    d.world.canary_timeout = True
    d.world.asleep = True  # the last scrape said awake; the one after the timeout says asleep
    d.run_for(10)
    assert restarts(d) == []
    assert d.events("probe.canary_asleep")


def test_without_the_sleep_metric_hangs_are_judged_as_before() -> None:
    d = Driver(SLEEPY)  # asleep=None: an older vLLM
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    d.world.canary_timeout = True
    d.run_for(64)  # the canary at 60 s and its longer retry (core/hangs.py)
    assert restarts(d) == ["hang"]


