"""Table and property tests of the pure drain timing and the sleep-state rule (fake clock:
time is a plain number passed in)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllmwatch.core import drain, hangs
from vllmwatch.core.drain import Phase, Verdict
from vllmwatch.shell import probes

D = drain.begin(100.0, 10.0, 30.0)


@pytest.mark.parametrize(("asked", "ready", "want"), [
    (True, True, (10.0, 30.0)),  # planned restart of a serving child: the full drain
    (False, True, (0.0, 0.0)),  # crash/hang/stall: nothing in flight can finish
    (True, False, (0.0, 0.0)),  # still starting: no balancer routes to it yet
    (False, False, (0.0, 0.0)),
])
def test_plan_skips_what_cannot_help(asked: bool, ready: bool,
                                     want: tuple[float, float]) -> None:
    assert drain.plan(asked, ready, 10.0, 30.0) == want


@pytest.mark.parametrize(("now", "running", "waiting", "want"), [
    (100.0, 0, 0, Verdict.WAIT),  # idle at once, but the balancer has not noticed yet
    (109.9, 0, 0, Verdict.WAIT),
    (109.9, 5, 5, Verdict.WAIT),
    (110.0, 0, 0, Verdict.STOP_IDLE),  # deregistered and idle
    (110.0, 1, 0, Verdict.WAIT),  # one still running
    (115.0, 0, 2, Verdict.WAIT),  # queued requests count too
    (125.0, None, None, Verdict.WAIT),  # no scrape: unknown is never idle
    (125.0, 0, None, Verdict.WAIT),
    (139.9, 1, 0, Verdict.WAIT),
    (140.0, 1, 0, Verdict.STOP_TIMEOUT),  # drain_timeout after the deregistration
    (140.0, None, None, Verdict.STOP_TIMEOUT),
    (140.0, 0, 0, Verdict.STOP_IDLE),
])
def test_decide(now: float, running: float | None, waiting: float | None,
                want: Verdict) -> None:
    assert drain.decide(D, now, running, waiting) == want


@pytest.mark.parametrize(("now", "want"), [
    (100.0, 110.0),  # first look: when the deregistration ends
    (105.0, 110.0),
    (110.0, 111.0),  # then every poll
    (139.5, 140.0),  # never past the deadline
    (145.0, 145.0),
])
def test_next_check(now: float, want: float) -> None:
    assert drain.next_check(D, now, 1.0) == want


def test_phases_and_durations_through_a_whole_drain() -> None:
    assert drain.phase(D, 100.0) == Phase.DEREGISTERING
    assert drain.durations(D, 104.0) == {"deregistering": 4.0, "draining": 0.0}
    assert drain.phase(D, 112.0) == Phase.DRAINING
    assert drain.durations(D, 112.5) == {"deregistering": 10.0, "draining": 2.5}
    d = drain.stopping(D, 113.0)
    assert drain.stopping(d, 200.0) == d  # the first SIGTERM is the one that counts
    assert drain.phase(d, 113.0) == Phase.STOPPING
    assert drain.decide(d, 150.0, 0, 0) == Verdict.WAIT  # already stopping: nothing to do
    d = drain.exited(d, 115.5)
    assert drain.durations(d, 999.0) == {"deregistering": 10.0, "draining": 3.0,
                                         "stopping": 2.5}


def test_zero_delay_is_todays_behaviour() -> None:
    d = drain.begin(50.0, 0.0, 30.0)
    assert drain.phase(d, 50.0) == Phase.DRAINING
    assert drain.decide(d, 50.0, 0, 0) == Verdict.STOP_IDLE
    assert drain.durations(drain.stopping(d, 50.0), 50.0)["deregistering"] == 0.0


def test_stop_during_deregistration_ends_it_there() -> None:
    d = drain.stopping(D, 103.0)  # e.g. vllmwatch itself was told to stop
    assert drain.durations(d, 104.0) == {"deregistering": 3.0, "draining": 0.0,
                                         "stopping": 1.0}


times = st.floats(min_value=0, max_value=1e6, allow_nan=False)


delays = st.floats(min_value=0, max_value=1e4, allow_nan=False)


counts = st.one_of(st.none(), st.floats(min_value=0, max_value=1e3, allow_nan=False))


@given(times, delays, delays, delays, counts, counts)
def test_never_stops_before_deregistered_and_never_waits_past_the_deadline(
        start: float, delay: float, timeout: float, dt: float,
        running: float | None, waiting: float | None) -> None:
    d = drain.begin(start, delay, timeout)
    now = start + dt
    verdict = drain.decide(d, now, running, waiting)
    if now < d.deregister_until:
        assert verdict == Verdict.WAIT
    if now >= drain.deadline(d):
        assert verdict != Verdict.WAIT
    assert drain.next_check(d, now, 1.0) >= now
    assert sum(drain.durations(d, now).values()) == pytest.approx(dt, abs=0.01)


@pytest.mark.parametrize(("awake", "want"), [
    ([], None),  # this vLLM does not report sleep: judge as before
    ([1.0], False),
    ([0.0], True),
    ([1.0, 0.0], True),  # one engine of two asleep
    ([1.0, 1.0], False),
])
def test_asleep_from_the_awake_series(awake: list[float], want: bool | None) -> None:
    assert hangs.asleep_from_awake(awake) is want


@pytest.mark.parametrize(("when_sent", "now", "send", "judge"), [
    (None, None, True, True),  # no sleep metric: unchanged behaviour
    (False, False, True, True),
    (True, True, False, False),  # asleep: no canary, and no verdict on one in flight
    (False, True, False, False),  # fell asleep while the canary was in flight
    (True, False, True, False),  # woke up while it was in flight: still not its fault
])
def test_sleep_rule(when_sent: bool | None, now: bool | None, send: bool,
                    judge: bool) -> None:
    assert hangs.send_canary(now) is send
    assert hangs.judge_canary(when_sent, now) is judge
    assert hangs.judge_stall(now) is (now is not True)


VLLM_SLEEP_TEXT = """# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means sleeping
# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{{engine="0",model_name="m",sleep_state="awake"}} {awake}
vllm:engine_sleep_state{{engine="0",model_name="m",sleep_state="weights_offloaded"}} {level1}
vllm:engine_sleep_state{{engine="0",model_name="m",sleep_state="discard_all"}} 0.0
vllm:num_requests_running{{engine="0",model_name="m"}} 0.0
"""


@pytest.mark.parametrize(("awake", "level1", "want"), [
    ("1.0", "0.0", False), ("0.0", "1.0", True)])
def test_the_sleep_series_as_vllm_writes_it(awake: str, level1: str, want: bool) -> None:
    text = VLLM_SLEEP_TEXT.format(awake=awake, level1=level1)
    assert hangs.asleep_from_awake(probes.awake_values(text)) is want
    assert probes.awake_values("vllm:num_requests_running 0\n") == []
