"""Table tests of the pure leak rules over synthetic series (no clock, no I/O)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from vllmwatch.config.schema import MemoryConfig
from vllmwatch.core import leak
from vllmwatch.core.leak import LeakVerdict, figures, new_state, observe, slope_per_hour

H = 3600.0
Series = Callable[[float], float]


def run(cfg: MemoryConfig, series: Series, hours: float, interval: float,
        kind: str = "gpu", ready_at: float = 0.0) -> tuple[float, LeakVerdict] | None:
    """Feed series(t) every interval from ready_at; return (t, verdict) of the first verdict."""
    state = new_state(ready_at)
    for i in range(int(hours * H / interval) + 1):
        now = ready_at + i * interval
        value = series(now)
        gpu, host = (value, None) if kind == "gpu" else (None, value)
        state, verdict = observe(state, cfg, now, gpu, host)
        if verdict is not None:
            return now, verdict
    return None


def flat(level: float) -> Series:
    return lambda t: level


def linear(level: float, per_hour: float, start: float = 0.0) -> Series:
    return lambda t: level + max(0.0, t - start) / H * per_hour


def spike(base: Series, at: float, length: float, height: float = 2048.0) -> Series:
    return lambda t: base(t) + (height if at <= t < at + length else 0.0)


def step(level: float, at: float, height: float) -> Series:
    return lambda t: level + (height if t >= at else 0.0)


def noisy(base: Series, sigma: float, seed: int) -> Series:
    rng = random.Random(seed)
    return lambda t: base(t) + rng.gauss(0.0, sigma)


REALISTIC = MemoryConfig(sample_interval=60, baseline_delay=600, slope_window=6 * H, sustain=3)
SMALL = MemoryConfig(sample_interval=10, baseline_delay=60, slope_window=600, sustain=3)
ALL_RULES = dict(gpu_limit=75000.0, gpu_growth_limit=1024.0, gpu_growth_rate=20.0)


def cfg_of(base: MemoryConfig, **rules: float) -> MemoryConfig:
    from dataclasses import replace

    return replace(base, **rules)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "cfg", "series", "hours", "interval"), [
    ("flat", cfg_of(REALISTIC, **ALL_RULES), flat(60000), 24, 60),
    ("flat small window", cfg_of(SMALL, **ALL_RULES), flat(60000), 1, 10),
    ("rules off", REALISTIC, linear(60000, 5000), 24, 60),
    ("spike 2 GiB, 2 samples", cfg_of(REALISTIC, gpu_limit=61000, gpu_growth_limit=1024,
                                      gpu_growth_rate=1.0),
     spike(flat(60000), 5 * H, 120), 12, 60),
    ("spike 2 GiB, small window", cfg_of(SMALL, gpu_limit=61000, gpu_growth_limit=1024,
                                         gpu_growth_rate=10.0),
     spike(flat(60000), 400, 20), 1, 10),
    ("spike on a slow leak below rate", cfg_of(REALISTIC, gpu_growth_rate=1.0),
     spike(linear(60000, 0.5), 4 * H, 120), 12, 60),
    ("step below growth limit", cfg_of(REALISTIC, gpu_growth_limit=1024), step(60000, 3 * H, 900),
     12, 60),
    ("step, rate rule only", cfg_of(REALISTIC, gpu_growth_rate=100.0),
     step(60000, 3 * H, 2048), 18, 60),
    ("noisy plateau", cfg_of(REALISTIC, gpu_limit=65000, gpu_growth_limit=1024,
                             gpu_growth_rate=20.0),
     noisy(flat(60000), 50.0, seed=1), 12, 30),
    ("noisy plateau small window", cfg_of(SMALL, gpu_limit=65000, gpu_growth_limit=1024,
                                          gpu_growth_rate=1000.0),
     noisy(flat(60000), 50.0, seed=2), 2, 10),
    ("slow leak under the rate", cfg_of(REALISTIC, gpu_growth_rate=0.2), linear(100, 0.1), 12, 60),
    ("start-up ramp before the baseline", cfg_of(SMALL, gpu_growth_rate=10.0),
     lambda t: 1000.0 + 50 * min(t, 60.0), 1, 10),
])
def test_does_not_fire(name: str, cfg: MemoryConfig, series: Series, hours: float,
                       interval: float) -> None:
    assert run(cfg, series, hours, interval) is None, name


@pytest.mark.parametrize(("cfg", "interval", "expected_at"), [
    # The window must be half full after the baseline, then the rule holds for `sustain`.
    (cfg_of(REALISTIC, gpu_growth_rate=0.05), 60, 600 + 3 * H + 2 * 60),
    (cfg_of(SMALL, gpu_growth_rate=0.05), 10, 60 + 300 + 2 * 10),
])
def test_slow_leak_caught_by_slope_in_expected_time(cfg: MemoryConfig, interval: float,
                                                    expected_at: float) -> None:
    got = run(cfg, linear(60000, 0.1), 12, interval)
    assert got is not None
    at, verdict = got
    assert verdict.rule == "gpu_growth_rate" and verdict.reason == "gpu_memory"
    assert verdict.waits_for_quiet_hours
    assert verdict.value == pytest.approx(0.1, rel=1e-3) and verdict.limit == 0.05
    assert expected_at <= at <= expected_at + interval
    assert "MiB/h" in verdict.detail and "gpu_growth_rate" in verdict.detail


def test_leak_under_noise_caught_by_slope() -> None:
    cfg = cfg_of(REALISTIC, gpu_growth_rate=20.0)
    got = run(cfg, noisy(linear(60000, 100.0), 50.0, seed=3), 12, 60)
    assert got is not None
    at, verdict = got
    assert verdict.rule == "gpu_growth_rate" and 80 < verdict.value < 120
    assert at <= 600 + 3 * H + 10 * 60


def test_step_fires_growth_limit_after_sustain() -> None:
    cfg = cfg_of(REALISTIC, gpu_growth_limit=1024)
    got = run(cfg, step(60000, 3 * H, 2048), 12, 60)
    assert got is not None
    at, verdict = got
    assert at == 3 * H + 2 * 60
    assert (verdict.rule, verdict.value, verdict.limit) == ("gpu_growth_limit", 2048, 1024)
    assert verdict.waits_for_quiet_hours
    assert "baseline 60000 MiB" in verdict.detail


def test_absolute_limit_fires_before_ready_and_never_waits() -> None:
    cfg = cfg_of(REALISTIC, gpu_limit=75000)
    got = run(cfg, flat(76000), 1, 60)
    assert got is not None
    at, verdict = got
    assert at == 2 * 60  # third sample; no baseline needed
    assert verdict.rule == "gpu_limit" and not verdict.waits_for_quiet_hours
    assert "76000 MiB > gpu_limit 75000 MiB for 3 samples" in verdict.detail


@pytest.mark.parametrize(("values", "sustain", "fires_at"), [
    ([1, 1, 0, 1, 1, 1], 3, 5),
    ([1, 0, 1, 0, 1, 0, 1], 2, None),
    ([1], 1, 0),
    ([0, 1, 1, 1, 1], 4, 4),
    ([1, 1, None, 1], 3, 3),  # an unknown sample neither holds nor breaks a streak
])
def test_sustain_counts_consecutive_samples(values: list[int | None], sustain: int,
                                            fires_at: int | None) -> None:
    cfg = MemoryConfig(host_limit=1000, sustain=sustain)
    state, fired = new_state(0.0), None
    for i, v in enumerate(values):
        mib = None if v is None else 500.0 + 1000.0 * v
        state, verdict = observe(state, cfg, float(i), None, mib)
        if verdict is not None:
            fired = i
            assert verdict.reason == "host_memory" and verdict.rule == "host_limit"
            break
    assert fired == fires_at


def test_verdict_repeats_while_it_holds_so_the_loop_can_wait_for_quiet_hours() -> None:
    cfg = MemoryConfig(gpu_growth_limit=100, baseline_delay=0, sustain=2)
    state = new_state(0.0)
    seen = []
    for i, v in enumerate([1000, 1200, 1200, 1200, 1200, 1000]):
        state, verdict = observe(state, cfg, float(i), float(v), None)
        seen.append(None if verdict is None else verdict.rule)
    assert seen == [None, None, "gpu_growth_limit", "gpu_growth_limit", "gpu_growth_limit",
                    None]


def test_urgent_verdict_wins_and_gpu_before_host() -> None:
    cfg = MemoryConfig(gpu_growth_limit=10, host_limit=100, host_growth_limit=10,
                       baseline_delay=0, sustain=1)
    state = new_state(0.0)
    state, _ = observe(state, cfg, 0.0, 50.0, 50.0)
    state, verdict = observe(state, cfg, 1.0, 500.0, 500.0)
    assert verdict is not None and verdict.rule == "host_limit"
    cfg2 = MemoryConfig(gpu_growth_limit=10, host_growth_limit=10, baseline_delay=0, sustain=1)
    _, verdict = observe(observe(new_state(0.0), cfg2, 0.0, 50.0, 50.0)[0], cfg2, 1.0, 500.0,
                         500.0)
    assert verdict is not None and verdict.rule == "gpu_growth_limit"


def test_baseline_is_first_sample_at_or_after_delay_and_figures() -> None:
    cfg = MemoryConfig(baseline_delay=600, slope_window=600, gpu_growth_rate=1.0)
    state = new_state(100.0)
    for now, gpu, host in [(200, 5000, 900), (699, 6000, 950), (700, None, 1000),
                           (710, 7000, 1010)]:
        state, _ = observe(state, cfg, float(now), None if gpu is None else float(gpu),
                           float(host))
    gpu_base, host_base, gpu_slope, host_slope = figures(state)
    assert (gpu_base, host_base) == (7000.0, 1000.0)
    assert gpu_slope is None and host_slope is None  # window not half full yet
    for i in range(1, 40):
        state, _ = observe(state, cfg, 710.0 + 10 * i, 7000.0 + i, 1010.0)
    _, _, gpu_slope, host_slope = figures(state)
    assert gpu_slope == pytest.approx(360.0) and host_slope == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize(("points", "expected"), [
    ([], None),
    ([(0.0, 1.0)], None),
    ([(5.0, 1.0), (5.0, 2.0)], None),
    ([(0.0, 0.0), (3600.0, 1.0)], 1.0),
    ([(0.0, 10.0), (1800.0, 10.0), (3600.0, 10.0)], 0.0),
    ([(1e9, 80000.0), (1e9 + 36.0, 80000.001), (1e9 + 72.0, 80000.002)], 0.1),
    ([(0.0, 0.0), (10.0, 2.0), (20.0, 1.0), (30.0, 3.0)], 0.08 * H),
])
def test_slope_per_hour(points: list[tuple[float, float]], expected: float | None) -> None:
    got = slope_per_hour(points)
    if expected is None:
        assert got is None
    else:
        assert got is not None and math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9)


def test_median_filter_removes_short_spikes_and_keeps_steps() -> None:
    pts = [(float(i), 10.0) for i in range(10)]
    pts[4] = (4.0, 2058.0)
    assert [v for _, v in leak.median_filter(pts, 2)] == [10.0] * 6
    steps = [(float(i), 0.0 if i < 5 else 1.0) for i in range(10)]
    assert [v for _, v in leak.median_filter(steps, 1)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_series_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leak, "MAX_POINTS", 32)
    cfg = MemoryConfig(baseline_delay=0, slope_window=100, gpu_growth_rate=1.0)
    state = new_state(0.0)
    for i in range(5000):
        state, _ = observe(state, cfg, i * 0.5, 1000.0 + i, None)
        assert len(state.gpu.points) <= 32 + 1
    assert state.gpu.points[-1][0] - state.gpu.points[0][0] <= 100


@pytest.mark.parametrize("interval", [1.0, 10.0, 30.0])
@pytest.mark.parametrize("sustain", [1, 3, 5])
def test_rate_rule_holds_for_sustain_fits_of_the_slope_at_any_sample_interval(
        interval: float, sustain: int) -> None:
    # A sample closer than window/MAX_POINTS to the last point adds no point, so the slope is
    # the one already judged: at the defaults (10 s samples, 21 s points) three samples were
    # one fit, and `sustain = 3` meant one fit at 10 s but three at 30 s.
    cfg = MemoryConfig(baseline_delay=0, gpu_growth_rate=100.0, sustain=sustain)
    state, fits = new_state(0.0), 0
    for i in range(int(2 * cfg.slope_window / interval)):
        now = i * interval
        last = state.gpu.points[-1][0] if state.gpu.points else None
        value = 1000.0 + max(0.0, now - cfg.slope_window) / H * 2000.0
        state, verdict = observe(state, cfg, now, value, None)
        refit = state.gpu.points[-1][0] != last
        if state.gpu.rate_streak and refit:
            fits += 1
        if verdict is not None:
            assert verdict.rule == "gpu_growth_rate"
            assert fits == sustain, f"fired after {fits} fits of the slope, not {sustain}"
            assert f"for {sustain} fits of the slope" in verdict.detail
            return
    pytest.fail("the rate rule never fired on a 2000 MiB/h leak")


def test_a_rate_rule_turned_off_between_two_fits_gives_no_verdict() -> None:
    # A streak kept between fits must still hold for the rule as it is now: a reload that
    # turns the rate rule off (or raises it) ends a waiting verdict at the next sample.
    cfg = MemoryConfig(baseline_delay=0, gpu_growth_rate=100.0, sustain=1)
    state, now, verdict = new_state(0.0), 0.0, None
    while verdict is None:
        now += 10.0
        state, verdict = observe(state, cfg, now, 1000.0 + max(0.0, now - 21600.0), None)
    assert verdict.rule == "gpu_growth_rate"
    off = MemoryConfig(baseline_delay=0, gpu_growth_rate=0.0, sustain=1)
    state, verdict = observe(state, off, now + 1.0, 1000.0 + now + 1.0 - 21600.0, None)
    assert state.gpu.points[-1][0] == now  # no fit at this sample
    assert verdict is None and state.gpu.rate_streak == 0


def test_a_rules_figures_read_as_numbers_not_exponents() -> None:
    """restart.begin, the record and `memory.rule_fired` said "grows 3.6e+03 MiB/h (halves
    3.6e+03, 3.6e+03 MiB/h)" for a leak of 3600 MiB/h (`:.3g`), and a 1 TiB limit read
    "gpu_limit 1.04858e+06 MiB" (`:g`): whole from 100 MiB up, 3 digits below."""
    got = run(cfg_of(SMALL, gpu_growth_rate=1000.0), linear(60000, 3600), 1, 10)
    assert got is not None and got[1].rule == "gpu_growth_rate", got
    assert "e+" not in got[1].detail and "grows 3600 MiB/h" in got[1].detail, got[1].detail
    assert "> gpu_growth_rate 1000 MiB/h" in got[1].detail, got[1].detail
    got = run(cfg_of(REALISTIC, gpu_limit=1048576), flat(1049000), 1, 60)
    assert got is not None, got
    assert "1049000 MiB > gpu_limit 1048576 MiB for 3 samples" in got[1].detail, got[1].detail
    slow = run(cfg_of(SMALL, gpu_growth_rate=0.05), linear(60000, 0.1), 12, 10)
    assert slow is not None and "grows 0.1 MiB/h" in slow[1].detail, slow
