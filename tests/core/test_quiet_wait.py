"""A memory restart held for restart.quiet_hours (core/leak.py): logged when the hold
begins and once an hour while it lasts, not at every sample (it was: ~6000 info lines for a
hold from 09:00 to 02:00 at a 10 s sample); its end logged when its beginning was; the
restart fires exactly when a rule holds and may not wait. Proved over any sequence."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from vllmwatch.core.actions import Log
from vllmwatch.core.leak import REMIND_S, LeakVerdict, Waiting
from vllmwatch.core.leak import judge_hold as judge
from vllmwatch.core.names import Reason

QUIET = "02:00-05:00"
IN, OUT = 3 * 60, 12 * 60  # minutes of day inside / outside the window


def _verdict(rule: str) -> LeakVerdict:
    waits = rule.endswith(("growth_limit", "growth_rate"))
    reason = Reason.GPU_MEMORY if rule.startswith("gpu") else Reason.HOST_MEMORY
    return LeakVerdict(reason, rule, 900.0, 500.0, waits, f"{rule} holds")


RULES = (None, "gpu_growth_limit", "host_growth_limit", "host_growth_rate", "gpu_limit")
STEP = st.tuples(st.floats(1.0, 1200.0), st.sampled_from(RULES), st.booleans())


@settings(max_examples=400, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=200))
def test_any_sequence_logs_a_hold_at_most_hourly_and_fires_exactly_when_it_may(
        steps: list[tuple[float, str | None, bool]]) -> None:
    w, now = Waiting(), 0.0
    held_at: dict[str, list[float]] = {}
    begun = ended = 0
    for dt, rule, in_window in steps:
        now += dt
        verdict = None if rule is None else _verdict(rule)
        before = w.hold
        w, acts, fires = judge(w, verdict, QUIET, IN if in_window else OUT, now)
        assert all(isinstance(a, Log) for a in acts)
        logs = [a for a in acts if isinstance(a, Log)]
        # fires exactly when a rule holds and may restart now
        assert fires == (verdict is not None and (not verdict.waits_for_quiet_hours
                                                  or in_window))
        assert (w.hold is None) == (verdict is None or fires)
        for log in logs:
            if log.event == "memory.rule_held":
                held_at.setdefault(log.fields["rule"], []).append(now)
                begun += 1
                assert log.fields["quiet_hours"] == QUIET and "next" in log.fields
            else:
                assert log.event == "memory.hold_ended" and before is not None
                assert before.logged  # only a hold whose beginning was logged
                ended += 1
        assert ended <= begun
        if w.hold is not None:  # never silent for an hour about a restart that waits
            assert verdict is not None and w.hold.rule == verdict.rule
            assert now - dict(w.logged_at)[w.hold.rule] < REMIND_S
            if before is not None:
                assert w.hold.since == before.since  # one hold, one start
    for times in held_at.values():  # at most once an hour per rule
        assert all(b - a >= REMIND_S for a, b in itertools.pairwise(times))


def test_a_day_long_hold_logs_once_an_hour_then_ends_once() -> None:
    w, now, events = Waiting(), 0.0, []
    for _ in range(int(3 * 3600 / 10)):  # three hours of 10 s samples outside the window
        now += 10.0
        w, acts, fires = judge(w, _verdict("host_growth_limit"), QUIET, OUT, now)
        assert not fires
        events += [(now, a.event) for a in acts if isinstance(a, Log)]
    assert [e for _, e in events] == ["memory.rule_held"] * 3
    assert [t for t, _ in events] == [10.0, 10.0 + REMIND_S, 10.0 + 2 * REMIND_S]
    assert w.hold is not None and w.hold.since == 10.0
    w, acts, fires = judge(w, None, QUIET, OUT, now + 10)
    assert not fires and w.hold is None
    [end] = acts
    assert isinstance(end, Log) and end.event == "memory.hold_ended"
    assert end.fields["held_s"] == round(now + 10 - 10.0, 1)


def test_a_flapping_rule_logs_no_more_than_a_steady_one() -> None:
    w, now, n = Waiting(), 0.0, 0
    for i in range(360):  # an hour: holds, then not, at every other sample
        now += 10.0
        w, acts, _ = judge(w, _verdict("gpu_growth_rate") if i % 2 == 0 else None, QUIET, OUT,
                           now)
        n += len(acts)
    assert n == 2  # the first hold's beginning and end; the rest are not logged


def test_the_window_opening_fires_the_held_rule() -> None:
    w, _, _ = judge(Waiting(), _verdict("gpu_growth_limit"), QUIET, OUT, 10.0)
    w, acts, fires = judge(w, _verdict("gpu_growth_limit"), QUIET, IN, 20.0)
    assert fires and acts == [] and w.hold is None
