"""Issue 37 §6: a /health that listens but never answers whole while vLLM starts (a trickle)
is timed out and counted as a failed probe, as it is once READY — never waited out silently
until startup.timeout. A refused connection while starting is only "not listening yet"."""

from __future__ import annotations

from tests.loop.test_machine import BASE, restarts
from tests.shell.test_bounds_http import _prober, peer, trickle, trickle_head
from vllmwatch.core.state import S
from vllmwatch.shell.probes import HttpProber
from vllmwatch.testing.driver import Driver, World, config_with


def test_a_trickling_health_while_starting_is_counted_and_restarts_at_the_threshold() -> None:
    c = config_with(BASE, startup={"stall_timeout": 1000, "timeout": 900})
    d = Driver(c, world=World(health_trickles=True))
    d.run_until(lambda: bool(restarts(d)), 120)
    failed = d.events("probe.failed")
    assert [f["consecutive"] for f in failed[:3]] == [1, 2, 3]
    assert all(f["probe"] == "health" and "timed out" in f["error"] for f in failed)
    assert restarts(d) == ["health"]  # at failure_threshold (3), not startup.timeout (900 s)


def test_a_refused_health_while_starting_is_not_a_failure() -> None:
    c = config_with(BASE, startup={"stall_timeout": 1000, "timeout": 900})
    d = Driver(c, world=World(health_ok=False))
    d.run_for(60)
    assert d.state.state == S.STARTING and d.events("probe.failed") == []


def test_the_health_probe_says_a_trickle_timed_out() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n"
    for serve in (trickle(head), trickle_head()):
        with peer(serve) as (port, _):
            prober: HttpProber = _prober(port)
            health = prober.health()
        assert not health.ok and health.timed_out and "whole request" in health.error
