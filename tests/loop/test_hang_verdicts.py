"""Issue 24's verdict table through the real Loop at the shipped [probe] defaults, on a fake
clock: probes take the fake time their results say (ClockedExecutor), so the detection times
below are exact fake seconds, independent of this machine's speed.

| case                                   | expected                                         |
| idle hang                              | timeout, one longer retry, `hang` within 10 s    |
| loaded hang (queue up, counters still) | `hang` from the frozen engine, before the canary |
| loaded but progressing                 | canary timeouts judged busy, never a restart     |
| starved host                           | the retry waits 4x; a slow canary that answers   |
|                                        | is no restart; a hang still is, later            |
| a canary slow once                     | retried, answers, no restart                     |
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllmwatch.config.schema import from_dict
from vllmwatch.config.units import format_duration
from vllmwatch.core.events import CanaryResult
from vllmwatch.core.state import S
from vllmwatch.testing.driver import ClockedExecutor, Driver, FakeClock, World

SHIPPED = from_dict({"vllm": {"model": "/m", "gpus": []}, "prewarm": {"enabled": False},
                     "drain": {"deregister_delay": 0}})


def up(**world: Any) -> Driver:
    """A READY child at the shipped defaults, with ~1 min of canary history behind it."""
    clock = FakeClock()
    d = Driver(SHIPPED, clock=clock, world=World(**world), executor=ClockedExecutor(clock))
    d.tick(5)
    assert d.state.state == S.READY
    d.tick(60)
    return d


def restarts(d: Driver) -> list[dict[str, Any]]:
    return d.events("restart.begin")


def detect(d: Driver, limit: float = 60.0) -> float:
    """Fake seconds from now until a restart begins (inf if none within limit)."""
    t0 = d.clock.now
    while d.clock.now - t0 < limit:
        d.tick(0.1)
        if restarts(d):
            return d.clock.now - t0
    return float("inf")


def one_canary_stuck(d: Driver) -> None:
    """Run until one canary is out that will time out; later ones answer as the World says."""
    assert isinstance(d.executor, ClockedExecutor)
    d.world.canary_timeout = True
    t0 = d.clock.now
    while not any(isinstance(r, CanaryResult) and r.timed_out for _, _, r in d.executor.held):
        assert d.clock.now - t0 < 10.0, "no canary sent"
        d.tick(0.05)
    d.world.canary_timeout = False


def timeouts(d: Driver) -> list[float]:
    return [f["timeout_s"] for f in d.events("probe.canary_timeout")]


def test_idle_hang_is_seen_within_10s_after_one_longer_retry() -> None:
    d = up()
    d.world.canary_timeout = True  # the engine stops: the canary never answers
    took = detect(d)
    assert took <= 10.0, took
    assert [r["reason"] for r in restarts(d)] == ["hang"]
    assert timeouts(d) == [2.0, 4.0]  # the floor, then 2x
    assert len(d.events("probe.canary_retry")) == 1
    assert "twice in a row" in restarts(d)[0]["detail"]
    assert d.world.signals[:1] == ["SIGKILL engines"]  # a stuck engine cannot drain


def test_loaded_hang_is_seen_from_the_frozen_engine_before_the_canary_gives_up() -> None:
    d = up(running=8, waiting=20, tokens_per_scrape=900, canary_seconds=2.0)
    assert d.state.child is not None and min(d.state.child.canary.seconds[-5:]) == 2.0
    d.world.tokens_per_scrape, d.world.canary_timeout = 0.0, True  # frozen with work queued
    took = detect(d)
    assert took <= 12.0, took
    begin = restarts(d)[0]
    assert begin["reason"] == "hang" and "no token counter or gauge moved" in begin["detail"]
    assert timeouts(d) == []  # the canary's own 8 s timeout had not even run out
    # the verdict is in the incident's timeline (issue 36.19)
    [(_, what)] = d.world.incidents[-1].facts["canary_verdicts"]
    assert what.startswith("work queued and nothing moved for ") and what.endswith(": hang")


def test_loaded_but_progressing_is_never_a_hang() -> None:
    d = up(running=64, waiting=100, tokens_per_scrape=5000)
    d.world.canary_timeout = True  # every canary times out, but tokens flow
    assert detect(d, 300.0) == float("inf")
    busy = d.events("probe.canary_busy")
    assert len(busy) >= 5 and not d.events("probe.canary_retry")
    assert max(timeouts(d)) == 30.0  # each retry longer, up to the ceiling
    assert d.state.state == S.READY


def test_a_canary_slow_once_is_retried_and_no_restart() -> None:
    d = up()
    one_canary_stuck(d)  # one canary times out at the 2 s floor ...
    d.world.canary_seconds = 3.0  # ... and its retry answers, slowly
    d.tick(30)
    assert timeouts(d) == [2.0] and len(d.events("probe.canary_retry")) == 1
    assert not restarts(d)
    assert d.state.child is not None and 3.0 in d.state.child.canary.seconds


def test_starved_host_gives_the_retry_four_times_the_time() -> None:
    d = up(cpu_pressure=99.5)
    one_canary_stuck(d)
    d.world.canary_seconds = 6.0  # the retry is slow, but it answers
    d.tick(30)
    retry = d.events("probe.canary_retry")
    assert retry and retry[0]["host_saturated"] and retry[0]["retry_timeout_s"] == 8.0
    assert not restarts(d)


def test_starved_host_still_restarts_a_real_hang_later() -> None:
    d = up(cpu_pressure=99.5)
    d.world.canary_timeout = True
    took = detect(d)
    assert 10.0 <= took <= 13.0, took  # 2 + 8 s of canary, after up to one interval
    assert timeouts(d) == [2.0, 8.0] and restarts(d)[0]["reason"] == "hang"


def test_starved_host_stretches_the_frozen_engine_verdict() -> None:
    d = up(running=8, waiting=20, tokens_per_scrape=900, canary_seconds=2.0, cpu_pressure=99.5)
    d.world.tokens_per_scrape, d.world.canary_timeout = 0.0, True
    took = detect(d)
    assert took > 12.0  # x3: 24 s of frozen counters, unless the canary decides first
    assert restarts(d)[0]["reason"] == "hang"


def test_the_timeout_follows_the_latencies() -> None:
    d = up(canary_seconds=1.5)  # 4 x 1.5 s
    d.world.canary_timeout = True
    d.tick(9)
    assert timeouts(d)[0] == 6.0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.booleans(), st.floats(0.0, 40.0), st.floats(0, 64)),
                min_size=1, max_size=6))
def test_no_hang_verdict_while_token_counters_advance(
        phases: list[tuple[bool, float, float]]) -> None:
    """Whatever the canary does (times out, answers slowly) and the queue holds, tokens that
    advance at every scrape never give a hang restart."""
    d = up(tokens_per_scrape=50, running=1)
    for times_out, seconds, queued in phases:
        d.world.canary_timeout, d.world.canary_seconds = times_out, max(0.01, seconds)
        d.world.waiting = queued
        d.tick(20, step=0.25)
    assert not restarts(d), restarts(d)


@pytest.mark.parametrize("scrape_fails", [True, False])
def test_a_failed_scrape_at_the_verdict_counts_as_no_progress(scrape_fails: bool) -> None:
    d = up()
    d.world.canary_timeout = True
    if scrape_fails:
        d.fx.raise_on.add("probe:metrics")
    assert detect(d) <= 10.0
    assert restarts(d)[0]["reason"] == "hang"


def test_a_hang_is_judged_when_metrics_carries_no_series() -> None:
    """vLLM run with --disable-log-stats: /metrics answers 200 without the progress series.
    A timed-out canary still gets its verdict (nothing can be seen to move), and the canary
    goes on: before, the suspicion waited for a series that never came and no canary was
    sent again, so a hang behind /health 200 was never restarted."""
    d = up(stats=False)
    d.world.canary_timeout = True
    assert detect(d) <= 10.0
    [begin] = restarts(d)
    assert begin["reason"] == "hang" and "no progress series" in begin["detail"], begin
    assert timeouts(d) == [2.0, 4.0]


def test_without_series_a_slow_canary_that_answers_is_no_restart() -> None:
    d = up(stats=False)
    one_canary_stuck(d)
    d.tick(30, step=0.25)
    assert not restarts(d), restarts(d)
    assert len(d.events("probe.canary_retry")) == 1


def test_a_long_prefill_alone_is_not_a_hang() -> None:
    """One huge prompt, nothing else: no token until its prefill ends, the canary waits behind
    it, but the KV-cache usage grows chunk by chunk (vLLM sends its stats every step)."""
    d = up()
    d.world.running, d.world.kv_per_scrape, d.world.canary_timeout = 1, 0.002, True
    assert detect(d, 120.0) == float("inf")
    assert d.events("probe.canary_busy") and not d.events("probe.canary_retry")


def test_busy_for_ever_is_a_hang_at_the_busy_bound() -> None:
    """Issue 37.8: every canary times out while /metrics says requests run and tokens grow
    (an API server wedged while its engine works): busy excuses it for probe.busy_timeout
    (600 s shipped), then it is a hang; the timeline of its record shows the verdicts."""
    d = up(running=4, waiting=0, tokens_per_scrape=500)
    d.world.canary_timeout = True
    took = detect(d, 700.0)
    assert 600.0 <= took < 700.0, took
    [begin] = restarts(d)
    assert begin["reason"] == "hang" and "wedged" in begin["detail"], begin
    assert "probe.busy_timeout 600s" in begin["detail"], begin
    busy = d.events("probe.canary_busy")
    assert len(busy) >= 5 and busy[-1]["busy_timeout_s"] == 600.0
    assert busy[-1]["busy_for_s"] < 600.0 <= busy[-1]["busy_for_s"] + 60.0
    # The incident's facts carry the canary verdicts that made it, for its timeline
    verdicts = d.world.incidents[-1].facts["canary_verdicts"]
    assert any("busy (4 running" in what for _, what in verdicts), verdicts
    assert verdicts[-1][1].endswith(": hang") and all(t <= 0 for t, _ in verdicts)


def test_status_says_how_long_the_canary_has_gone_unanswered_while_busy_excuses_it() -> None:
    """A wedged API server (no client answered, the engine's counters moving) is excused for
    probe.busy_timeout, 10 min shipped, while the journal logs probe.canary_timeout warnings:
    `vllmwatch status` said "ready yes", the canary "last done 1s ago" and no failure, and
    STATUS= only "ready"; both now say how long no canary has answered and the bound."""
    from vllmwatch.status import cli as status_cli
    from vllmwatch.status.snapshot import Snapshot
    from vllmwatch.status.statusline import snapshot_of, summary

    d = up(running=4, waiting=0, tokens_per_scrape=500)
    healthy = snapshot_of(d.state, d.clock.now, 1.7e9, Snapshot(), None)
    assert healthy.canary_unanswered_s is None
    assert "canary" not in summary(healthy)
    d.world.canary_timeout = True
    assert detect(d, 120.0) == float("inf")  # excused as busy, no restart yet
    busy = d.events("probe.canary_busy")[-1]["busy_for_s"]
    snap = snapshot_of(d.state, d.clock.now, 1.7e9, Snapshot(), None)
    assert snap.canary_unanswered_s is not None and snap.canary_unanswered_s >= busy >= 60
    assert f"canary unanswered {format_duration(snap.canary_unanswered_s)}" in summary(snap)
    text = status_cli.render(snap.to_json(), now=1.7e9)
    assert (f"canary    UNANSWERED for {format_duration(snap.canary_unanswered_s)}: excused "
            "while vLLM's counters move; a hang restart at probe.busy_timeout 10m") in text
    d.world.canary_timeout = False  # one answer ends it
    d.tick(10)
    assert snapshot_of(d.state, d.clock.now, 1.7e9, Snapshot(), None).canary_unanswered_s \
        is None


def test_a_timeout_derived_from_the_latencies_reads_in_tenths() -> None:
    """Latencies of 1.2345678 s: the timeout p99 x 4 and its retry x 2 read "last after
    9.87654s" in restart.begin's detail and "timed out after 4.93827s" in the timeline."""
    d = up(canary_seconds=1.2345678)
    d.world.canary_timeout = True
    assert detect(d) < 60.0
    [begin] = restarts(d)
    assert "(last after 9.9s)" in begin["detail"], begin
    [record] = d.world.incidents
    said = [what for _, what in record.facts["canary_verdicts"]]
    assert "canary timed out after 4.9s: nothing moved, retry with 9.9s" in said, said
