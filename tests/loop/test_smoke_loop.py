"""Smoke checks before READY (issue 38.2) through the real loop over a scripted World: when
they run (after the canary, before READY=1, once per start), what a failure holds, and how a
held start ends (a start failure that names the check)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tests.support.tinylora import make
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.core.events import ReloadRequested
from vllmwatch.core.state import S
from vllmwatch.testing.driver import ClockedExecutor, Driver, FakeClock, World

RAW: dict[str, Any] = {
    "vllm": {"model": "/m", "gpus": []},
    "probe": {"interval": 5, "canary_interval": 60, "canary_timeout": 30},
    "startup": {"timeout": 120, "stall_timeout": 30},
    "restart": {"backoff_initial": 5, "backoff_max": 60, "backoff_jitter": 0.0,
                "max_restarts": 5, "window": 3600, "stable_after": 600},
    "prewarm": {"enabled": False},
    "memory": {"sample_interval": 10, "pss_interval": 10},
    "drain": {"deregister_delay": 0},
    "smoke": [{"endpoint": "chat"}, {"endpoint": "messages"},
              {"endpoint": "tools", "name": "tools-optional", "required": False}],
}
BASE = from_dict(RAW)


def ready(d: Driver) -> bool:
    return d.state.state == S.READY


def _order(d: Driver) -> list[str]:
    """Canary results, smoke results and READY=1, in the order the loop saw them."""
    out = []
    for log in d.logs:
        if log.event in ("smoke.passed", "smoke.failed"):
            out.append(f"{log.event}:{log.fields['check']}")
        elif log.event == "child.ready":
            out.append("ready")
    return out


def test_checks_run_after_the_canary_once_each_then_ready() -> None:
    d = Driver(BASE)
    assert d.run_until(lambda: ready(d), 60)
    assert d.world.smoke_sent == ["chat", "messages", "tools-optional"]
    assert _order(d) == ["smoke.passed:chat", "smoke.passed:messages",
                         "smoke.passed:tools-optional", "ready"]
    assert len(d.notifier.sent("READY=1")) == 1
    d.run_for(600)  # READY lasts: the canary goes on, the smoke checks never run again
    assert d.world.smoke_sent == ["chat", "messages", "tools-optional"]
    assert d.state.probe_seconds.get("canary") is not None


def test_no_checks_no_smoke_module_in_the_path() -> None:
    cfg = dataclasses.replace(BASE, smoke=())
    d = Driver(cfg)
    assert d.run_until(lambda: ready(d), 60)
    assert d.world.smoke_sent == [] and d.state.child is not None
    assert d.state.child.smoke is None


def test_a_failed_optional_check_is_reported_and_does_not_hold_ready() -> None:
    d = Driver(BASE, world=World(smoke_errors={"tools-optional": "HTTP 400 from x: nope"}))
    assert d.run_until(lambda: ready(d), 60)
    failed = d.events("smoke.failed")
    assert [f["check"] for f in failed] == ["tools-optional"]
    assert failed[0]["required"] is False and "nope" in failed[0]["error"]
    assert failed[0]["answer"]  # the answer's first bytes are in the log


def test_a_failed_required_check_holds_ready_then_fails_the_start_by_name() -> None:
    world = World(smoke_errors={"messages": "HTTP 404 from /v1/messages: Not Found"})
    d = Driver(BASE, world=world)
    d.run_for(60)
    assert d.state.state == S.STARTING and d.notifier.sent("READY=1") == []
    assert world.smoke_sent == ["chat", "messages"]  # nothing more once one failed
    assert [f["check"] for f in d.events("smoke.failed")] == ["messages"]
    assert d.events("restart.begin") == []  # held, not stalled: vLLM says nothing meanwhile
    assert d.run_until(lambda: bool(d.events("restart.begin")), 120)
    begin = d.events("restart.begin")[0]
    assert begin["reason"] == "start_timeout"
    assert "smoke check 'messages'" in begin["detail"] and "Not Found" in begin["detail"]
    assert "answer: " in begin["detail"]


def test_a_check_failing_then_passing_on_the_next_start() -> None:
    world = World(smoke_errors={"chat": "HTTP 500 from /v1/chat/completions"})
    d = Driver(BASE, world=world)
    assert d.run_until(lambda: bool(d.events("restart.begin")), 200)
    world.smoke_errors.clear()  # the next start's checks pass
    assert d.run_until(lambda: ready(d), 200)
    assert world.smoke_sent == ["chat", "chat", "messages", "tools-optional"]
    assert world.spawns == 2


def test_each_check_once_per_start_whatever_health_says() -> None:
    world = World(smoke_errors={"chat": "HTTP 500"})
    d = Driver(BASE, world=world)
    d.run_for(100)  # ~100 /health answers 200 meanwhile
    assert world.smoke_sent == ["chat"]


def test_a_reload_changes_the_next_starts_checks_not_this_ones() -> None:
    world = World(smoke_errors={"chat": "HTTP 500"})
    d = Driver(BASE, world=world)
    d.run_for(30)
    cfg: Config = dataclasses.replace(BASE, smoke=BASE.smoke[1:])
    d.send(ReloadRequested(cfg))
    d.run_for(30)
    assert world.smoke_sent == ["chat"] and d.state.state == S.STARTING
    assert d.run_until(lambda: ready(d), 300)  # the next start runs the new list
    assert world.smoke_sent == ["chat", "messages", "tools-optional"]


def test_a_smoke_worker_that_raises_is_a_failed_check() -> None:
    d = Driver(BASE)
    d.fx.raise_on.add("smoke")
    d.run_for(30)
    failed = d.events("smoke.failed")
    assert failed and "injected failure" in failed[0]["error"]
    assert d.state.state == S.STARTING


def test_a_start_whose_checks_take_longer_than_the_stall_rule_is_not_a_stall() -> None:
    """vLLM is quiet while the checks run (`disable-uvicorn-access-log = true`, as
    BENCHMARKS.md suggests, and no stats line): checks that answer, one after the other,
    for longer than startup.stall_timeout in all were a `start_stall` restart ("no output
    and no progress") of a start that was passing them. Each check has its own deadline and
    startup.timeout bounds them all: the stall rule is for a start that does not get there."""
    clock = FakeClock()
    raw = {**RAW, "startup": {"timeout": 600, "stall_timeout": 30},
           "smoke": [{"endpoint": "chat", "name": f"c{i}", "timeout": 60} for i in range(3)]}
    d = Driver(from_dict(raw), clock=clock, world=World(smoke_seconds=20.0),
               executor=ClockedExecutor(clock))
    d.tick(150, step=0.5)
    assert not d.events("restart.begin"), d.events("restart.begin")
    assert ready(d) and [f["check"] for f in d.events("smoke.passed")] == ["c0", "c1", "c2"]


def test_a_check_unanswered_at_startup_timeout_is_named_by_the_start_failure() -> None:
    """A check whose own timeout outlasts startup.timeout (a tools check given 10 minutes)
    never answered in that start: the start_timeout's detail named no check, and no
    smoke.passed or smoke.failed said it, so `journalctl -g smoke` showed nothing of it."""
    clock = FakeClock()
    raw = {**RAW, "smoke": [{"endpoint": "chat", "timeout": "2m"},
                            {"endpoint": "tools", "timeout": "10m"}]}
    d = Driver(from_dict(raw), clock=clock, world=World(smoke_seconds=70.0),
               executor=ClockedExecutor(clock))
    d.tick(130, step=0.5)  # chat answers at ~72 s; tools, sent then, not by 120 s
    begin = d.events("restart.begin")[0]
    assert begin["reason"] == "start_timeout"
    assert "smoke check 'tools' (tools, /v1/chat/completions) was sent and had not " \
        "answered" in begin["detail"], begin


def test_an_adapters_check_asks_the_route_of_the_canary_custom_or_fixed(tmp_path: Path) -> None:
    """A pooling model's adapters are checked on its route (not /v1/completions, which it
    has not): the route of probe.canary, fixed or custom with a known path."""
    for probe in ({"canary": "embeddings"},
                  {"canary": "custom", "canary_path": "/v1/embeddings",
                   "canary_body": '{"input": "x"}'}):
        raw = {**RAW, "probe": {**RAW["probe"], **probe}, "smoke": [],
               "adapters": [{"name": "emb", "path": str(make(tmp_path / "emb"))}]}
        d = Driver(from_dict(raw))
        assert d.run_until(lambda d=d: ready(d), 60)
        [passed] = d.events("smoke.passed")
        assert (passed["check"], passed["path"]) == ("adapter:emb", "/v1/embeddings"), probe
