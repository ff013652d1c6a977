"""Quiet hours spread per host: a stable slot inside the window, different across a fleet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllmwatch.config.schema import from_dict
from vllmwatch.config.units import host_offset, in_window, parse_window, spread
from vllmwatch.daemon import host_key, spread_config


@pytest.mark.parametrize("window,fraction,starts_between", [
    ("02:00-05:00", 0.5, ("02:00", "03:29")),
    ("23:00-01:00", 0.5, ("23:00", "23:59")),  # wraps midnight
    ("22:00-24:00", 1.0, ("22:00", "23:58")),  # keeps at least a minute
    ("02:00-02:01", 0.5, ("02:00", "02:00")),  # too short to spread
    ("02:00-05:00", 0.0, ("02:00", "02:00")),  # off
])
def test_spread_table(window: str, fraction: float, starts_between: tuple[str, str]) -> None:
    lo, hi = (int(t[:2]) * 60 + int(t[3:]) for t in starts_between)
    for host in range(50):
        got = spread(window, f"host{host}", fraction)
        start, end = parse_window(got)
        assert end == parse_window(window)[1]
        assert lo <= start <= hi, (got, host)


def test_empty_window_stays_empty() -> None:
    assert spread("", "h", 0.5) == ""


windows = st.tuples(st.integers(0, 1439), st.integers(1, 1439)).map(
    lambda t: f"{t[0] // 60:02d}:{t[0] % 60:02d}-{(t[0] + t[1]) % 1440 // 60:02d}:"
              f"{(t[0] + t[1]) % 1440 % 60:02d}")


@given(windows, st.text(max_size=40), st.floats(0.0, 1.0))
def test_spread_window_lies_inside_and_is_stable(window: str, key: str, fraction: float
                                                 ) -> None:
    got = spread(window, key, fraction)
    assert got == spread(window, key, fraction)
    inside = [m for m in range(1440) if in_window(got, m)]
    assert inside, got
    assert all(in_window(window, m) for m in inside)
    total = sum(1 for m in range(1440) if in_window(window, m))
    assert len(inside) >= total - int(total * fraction)


def test_a_fleet_spreads_out() -> None:
    starts = {spread("02:00-05:00", f"machine{i}:host{i}:8000", 0.5) for i in range(200)}
    assert len(starts) > 60  # 200 hosts over 90 minutes: no thundering herd


@given(st.text(), st.integers(1, 10_000))
def test_host_offset_in_range(key: str, span: int) -> None:
    assert 0 <= host_offset(key, span) < span


def test_host_key_reads_machine_id(tmp_path: Path) -> None:
    empty, mid = tmp_path / "empty", tmp_path / "machine-id"
    empty.write_text("\n")
    mid.write_text("0123abcd\n")
    key = host_key("8000", paths=(str(tmp_path / "missing"), str(empty), str(mid)))
    assert key.startswith("0123abcd:") and key.endswith(":8000")
    assert host_key("8001", paths=(str(mid),)) != key


def test_spread_config_moves_the_window() -> None:
    logged: list[tuple[str, dict[str, Any]]] = []
    config = from_dict({"vllm": {"model": "m"}, "restart": {"quiet_hours": "02:00-05:00"}})
    got = spread_config(config, lambda lvl, ev, **kw: logged.append((ev, kw)), key="k")
    assert got.restart.quiet_hours == spread("02:00-05:00", "k", 0.5)
    assert logged[0][0] == "quiet_hours.spread"
    off = from_dict({"vllm": {"model": "m"}, "restart": {"quiet_hours": "02:00-05:00",
                                                         "quiet_hours_spread": 0}})
    assert spread_config(off, lambda *a, **k: None) is off
