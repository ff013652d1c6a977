"""The pure policy tables beside the machine: backoff, exit explanations, busy and stall
rules, and the transition table."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllmwatch.config.schema import RestartConfig, from_dict
from vllmwatch.core import policy
from vllmwatch.core.state import S, TransitionError, WatchState, goto

# The restart settings of tests/loop/test_machine.py's BASE, which the backoff table reads.
BASE = from_dict({
    "vllm": {"model": "/m", "gpus": []},
    "restart": {"backoff_initial": 5, "backoff_max": 60, "backoff_jitter": 0.0,
                "max_restarts": 5, "window": 3600, "drain_timeout": 30, "stop_timeout": 30,
                "stable_after": 600},
})


@pytest.mark.parametrize(("failures", "expected"), [(0, 0.0), (1, 5.0), (2, 10.0), (3, 20.0),
                                                    (4, 40.0), (5, 60.0), (9, 60.0)])
def test_backoff_table(failures: int, expected: float) -> None:
    assert policy.backoff_delay(BASE.restart, failures, 0.5) == expected


def test_backoff_jitter_stays_within_its_fraction() -> None:
    cfg = RestartConfig(backoff_initial=10, backoff_max=100, backoff_jitter=0.2)
    values = [policy.backoff_delay(cfg, 1, r / 10) for r in range(10)]
    assert min(values) == pytest.approx(8.0) and max(values) <= 12.0
    assert len(set(values)) == 10


@settings(deadline=None)
@given(initial=st.floats(0.0, 86400.0), most=st.floats(0.0, 86400.0),
       multiplier=st.floats(1e-6, 1e6), jitter=st.floats(0.0, 1.0),
       failures=st.integers(-1, 10**6), rand=st.floats(0.0, 1.0, exclude_max=True))
def test_backoff_is_never_negative_nor_past_its_max(initial: float, most: float,
                                                     multiplier: float, jitter: float,
                                                     failures: int, rand: float) -> None:
    """Every count of failures in a row: they never reset while no run is stable, and a
    flapping engine under a short restart.window never trips the guard; at the 1025th
    (the 311th with backoff_multiplier 10) the power overflowed and the core raised."""
    cfg = RestartConfig(backoff_initial=initial, backoff_max=max(initial, most),
                        backoff_multiplier=multiplier, backoff_jitter=jitter)
    delay = policy.backoff_delay(cfg, failures, rand)
    assert 0.0 <= delay <= cfg.backoff_max
    if failures <= 0:
        assert delay == 0.0


def test_transition_table_refuses_what_it_does_not_list() -> None:
    s = WatchState(config=BASE)
    with pytest.raises(TransitionError):
        goto(s, S.READY, 0.0, "skip the start")


@pytest.mark.parametrize(("code", "sig", "asked", "words"), [
    (0, None, False, "without being asked"), (None, "SIGKILL", False, "OOM killer"),
    (2, None, False, "rejected its arguments"), (1, None, True, "code 1")])
def test_exit_explanations(code: int | None, sig: str | None, asked: bool, words: str) -> None:
    assert words in policy.explain_exit(code, sig, asked)


def test_busy_and_stall_policies() -> None:
    p0 = policy.Progress(0, 1, 0, 100)
    assert policy.is_busy(p0, policy.Progress(10, 1, 0, 150))
    assert not policy.is_busy(p0, policy.Progress(10, 1, 0, 100))
    assert not policy.is_busy(p0, policy.Progress(10, 0, 0, 150))
    assert policy.stalled_since(None, p0, policy.Progress(10, 1, 0, 100)) == 0
    assert policy.stalled_since(0, p0, policy.Progress(10, 1, 0, 101)) is None
    assert policy.stalled_since(None, p0, policy.Progress(10, 0, 0, 100)) is None
