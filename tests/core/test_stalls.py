"""The start-stall hint (core/hangs.py): the tree's CPU share while nothing was printed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vllmwatch.core import hangs


def test_a_reading_after_progress_starts_a_new_span() -> None:
    marks = hangs.mark_cpu(None, 0.0, 10.0, 1.0)
    marks = hangs.mark_cpu(marks, 0.0, 20.0, 3.0)
    assert marks == ((10.0, 1.0), (20.0, 3.0))
    # Output at t=25: the old span no longer describes the silence.
    assert hangs.mark_cpu(marks, 25.0, 30.0, 4.0) == ((30.0, 4.0), (30.0, 4.0))


def test_no_hint_without_a_span_or_when_a_process_took_its_cpu_time_away() -> None:
    assert hangs.stall_hint(None, 0.0) == ""
    assert hangs.stall_hint(((10.0, 1.0), (12.0, 2.0)), 0.0) == ""  # < MIN_SPAN
    assert hangs.stall_hint(((10.0, 9.0), (40.0, 2.0)), 0.0) == ""  # the sum fell: unknown
    assert hangs.stall_hint(((10.0, 1.0), (40.0, 30.0)), 15.0) == ""  # progress since the mark


def test_busy_and_starved_read_differently() -> None:
    busy = hangs.stall_hint(((0.0, 0.0), (100.0, 90.0)), 0.0)
    starved = hangs.stall_hint(((0.0, 0.0), (100.0, 1.0)), 0.0)
    assert "90% of one CPU over the last 100s" in busy and "stall_timeout" in busy
    assert "1% of one CPU" in starved and "starved" in starved


finite = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@given(st.lists(st.tuples(finite, finite), min_size=1, max_size=20), finite)
def test_hint_is_total(readings: list[tuple[float, float]], last_progress: float) -> None:
    """Any sequence of readings gives a hint or '' and never raises; a rate is never
    negative and a span starts at or after the last progress."""
    marks = None
    for now, cpu in sorted(readings):
        marks = hangs.mark_cpu(marks, last_progress, now, cpu)
    assert marks is not None
    got = hangs.cpu_share(marks)
    assert got is None or (got[0] >= 0 and got[1] >= hangs.STALL_MIN_SPAN)
    text = hangs.stall_hint(marks, last_progress)
    assert text == "" or "% of one CPU" in text
