"""A start that times out because every canary failed says what the last canary got (vLLM's
HTTP 400 for a prompt it refuses, a 500, a timeout): "not ready after 900s" alone left the
operator to find the answer in vLLM's access log. A start whose canary answered at the end
says nothing of a canary."""

from __future__ import annotations

from tests.loop.test_machine import BASE, restarts
from vllmwatch.testing.driver import Driver, World, config_with


def _start_timeout(d: Driver) -> dict[str, object]:
    d.run_until(lambda: bool(restarts(d)), 400)
    begin = d.events("restart.begin")[0]
    assert begin["reason"] == "start_timeout", begin
    return begin


def test_a_start_timeout_names_the_last_canary_s_answer() -> None:
    c = config_with(BASE, startup={"stall_timeout": 1000, "timeout": 120})
    begin = _start_timeout(Driver(c, world=World(canary_ok=False)))
    assert "not ready after 120s" in str(begin["detail"]) and \
        "the last canary: HTTP 500" in str(begin["detail"]), begin


def test_a_start_timeout_with_no_canary_sent_names_none() -> None:
    c = config_with(BASE, startup={"stall_timeout": 1000, "timeout": 120})
    begin = _start_timeout(Driver(c, world=World(health_ok=False)))
    assert "canary" not in str(begin["detail"]), begin


def test_a_start_timeout_names_the_last_start_milestone_and_the_time_since() -> None:
    """"not ready after 1800s (startup.timeout)" named the timeout, not where the start
    stuck: the last milestone (graphs_start: capturing CUDA graphs; load_start: the weights)
    was only in the record's timeline. The detail (journal, status, record) now says it and
    how long nothing followed; with no milestone at all, that vLLM never showed one."""
    from vllmwatch.core.events import ChildOutput

    c = config_with(BASE, startup={"stall_timeout": 1000, "timeout": 120})
    d = Driver(c, world=World(health_ok=False))
    d.run_for(10)
    d.send(ChildOutput(milestone="weights"))
    d.run_for(20)
    d.send(ChildOutput(milestone="graphs_start"))
    begin = _start_timeout(d)
    detail = str(begin["detail"])
    assert detail.startswith("not ready after 120s (startup.timeout)"), detail
    assert "; its last start milestone: graphs_start at +30s, none in the 90s after" in detail
    none = str(_start_timeout(Driver(c, world=World(health_ok=False)))["detail"])
    assert "; no start milestone in vLLM's output" in none, none
