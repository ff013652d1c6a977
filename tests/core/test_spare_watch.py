"""The spare while it serves is watched (review of 2026-12-05): nothing checked it, so a spare
whose engine hung held every request the gate sent it until the relaunch's READY, unseen
(status said it served). The shell checks its canary and token counters at the canary's pace
(SpareChecked); the core calls it hung after probe.failure_threshold canaries in a row
unanswered while its counters stood still (a full KV cache queues a canary: busy, not hung),
routes back, stops it and rebuilds it at the next READY."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.core.test_spare_failover import SpareWorld, _crash, _logs, _ready, _rung
from vllmwatch.core.failover import (
    Route,
    SpareChecked,
    SpareWoken,
    StopSpare,
    Track,
    WakeSpare,
    checked,
)
from vllmwatch.core.failover import Rung as R


def _serving() -> tuple[SpareWorld, int, int]:
    m = SpareWorld()
    _ready(m)
    m.time_passes(3.0)
    m.world_is_kind(1)
    _crash(m)
    m.spare_answers(WakeSpare, SpareWoken(True, "", 0.7))
    assert _rung(m) == R.SERVING and m.s.spare is not None and m.s.spare.pid is not None
    return m, m.s.spare.pid, len(m.history)


def test_a_hung_spare_is_routed_away_stopped_and_rebuilt_at_the_next_ready() -> None:
    m, pid, mark = _serving()
    n = m.s.config.probe.failure_threshold
    for i in range(n):
        assert _rung(m) == R.SERVING, f"hung after {i} of {n}"
        m._step(SpareChecked(False, "canary: TimeoutError: timed out", pid, moved=False))
    acts = m.history[mark:]
    hung = _logs(acts, "spare.hung_serving")
    assert hung and f"{n} canaries in a row" in str(hung[0].fields["detail"])
    routes = [a.to for a in acts if isinstance(a, Route)]
    assert routes[-1] == "full" and _rung(m) == R.DOWN
    assert [a for a in acts if isinstance(a, StopSpare)]
    _ready(m)  # the relaunch's READY: rebuilt, armed again
    assert _rung(m) == R.ASLEEP and m.s.spare is not None and m.s.spare.pid != pid


@pytest.mark.parametrize("between", ["answered", "moved"])
def test_a_busy_or_answering_spare_is_never_called_hung(between: str) -> None:
    m, pid, mark = _serving()
    n = m.s.config.probe.failure_threshold
    for _ in range(5):
        for _ in range(n - 1):
            m._step(SpareChecked(False, "canary: timed out", pid))
        m._step(SpareChecked(between == "answered", "", pid, moved=between == "moved"))
    assert _rung(m) == R.SERVING and not _logs(m.history[mark:], "spare.hung_serving")


def test_checks_of_another_spare_or_outside_serving_change_nothing() -> None:
    m, pid, mark = _serving()
    for _ in range(10):
        m._step(SpareChecked(False, "late", pid + 1))  # an earlier build's watcher
    assert _rung(m) == R.SERVING and m.s.spare is not None and m.s.spare.unanswered == 0
    _ready(m)
    assert _rung(m) == R.ASLEEP
    for _ in range(10):
        m._step(SpareChecked(False, "landed after the route back", pid))
    assert _rung(m) == R.ASLEEP and not _logs(m.history[mark:], "spare.hung_serving")


@given(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=30), st.integers(1, 5))
def test_hung_only_after_threshold_unanswered_still_checks_in_a_row(
        checks: list[tuple[bool, bool]], threshold: int) -> None:
    t = Track(why="", retries=2, rung=R.SERVING, pid=7)
    run = 0
    for ok, moved in checks:
        t, hung = checked(t, SpareChecked(ok, "x", 7, moved), threshold)
        run = 0 if ok or moved else run + 1
        assert bool(hung) == (run == threshold), (run, hung)
        if hung:
            run = 0
        assert t.unanswered == run
    assert checked(dataclasses.replace(t, rung=R.ASLEEP), SpareChecked(False, "", 7),
                   1) == (dataclasses.replace(t, rung=R.ASLEEP), "")
