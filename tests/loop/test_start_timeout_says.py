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
