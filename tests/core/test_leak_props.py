"""Invariants of the pure leak rules (core/leak.py), over any series, gaps and settings.

The table tests (test_leak.py) pin the behaviour on chosen series; these say what must hold
for every one: a steady figure never restarts vLLM, a figure above a limit for `sustain`
samples always does, a one-off step is never a growth *rate*, unknown samples (None) and
samples of another kind of figure neither start nor break a streak.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from vllmwatch.config.schema import MemoryConfig
from vllmwatch.core.leak import new_state, observe

H = 3600.0
BASE = MemoryConfig(sample_interval=60, baseline_delay=600, slope_window=6 * H, sustain=3)
MIB = st.floats(0, 200_000, allow_nan=False)
GAPS = st.lists(st.floats(0.001, 40_000), min_size=1, max_size=300)  # stalls, bursts


@settings(max_examples=200, deadline=None)
@given(level=MIB, gaps=GAPS, sustain=st.integers(1, 6), delay=st.floats(0, 4 * H),
       growth=st.floats(0.001, 1e5), rate=st.floats(0.001, 1e5), margin=st.floats(0, 1e5))
def test_a_constant_figure_never_fires(level: float, gaps: list[float], sustain: int,
                                       delay: float, growth: float, rate: float,
                                       margin: float) -> None:
    cfg = replace(BASE, sustain=sustain, baseline_delay=delay, gpu_limit=level + margin,
                  host_limit=level + margin, gpu_growth_limit=growth, host_growth_limit=growth,
                  gpu_growth_rate=rate, host_growth_rate=rate)
    s, t = new_state(0.0), 0.0
    for gap in gaps:
        t += gap
        s, verdict = observe(s, cfg, t, level, level, "nvml-process")
        assert verdict is None


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.none(), MIB), min_size=1, max_size=80),
       sustain=st.integers(1, 6), limit=st.floats(1, 200_000))
def test_the_limit_fires_exactly_after_sustain_known_samples_above_it(
        values: list[float | None], sustain: int, limit: float) -> None:
    """Unknown samples (None) neither break nor extend the run above the limit."""
    cfg = replace(BASE, sustain=sustain, gpu_limit=limit)
    s, run = new_state(0.0), 0
    for i, v in enumerate(values):
        s, verdict = observe(s, cfg, 10.0 * i, v, None, None if v is None else "nvml-process")
        if v is not None:
            run = run + 1 if v > limit else 0
        assert (verdict is not None) == (v is not None and run >= sustain), (i, run)
        assert verdict is None or (verdict.rule == "gpu_limit" and verdict.value == v
                                   and not verdict.waits_for_quiet_hours)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(MIB, min_size=1, max_size=80), sustain=st.integers(1, 6),
       limit=st.floats(1, 50_000), delay=st.integers(0, 20))
def test_growth_fires_exactly_after_sustain_samples_above_the_baseline(
        values: list[float], sustain: int, limit: float, delay: int) -> None:
    """The baseline is the first sample at or after baseline_delay; nothing fires before."""
    cfg = replace(BASE, sustain=sustain, gpu_growth_limit=limit, baseline_delay=10.0 * delay)
    s, run, base = new_state(0.0), 0, None
    for i, v in enumerate(values):
        s, verdict = observe(s, cfg, 10.0 * i, v, None, "nvml-process")
        if i >= delay and base is None:
            base = v
        run = run + 1 if base is not None and v - base > limit else 0
        assert (verdict is not None) == (run >= sustain), (i, base, run)


@settings(max_examples=200, deadline=None)
@given(step_at=st.floats(0, 48 * H), height=st.floats(1, 60_000), level=MIB,
       gaps=st.lists(st.floats(1, 4000), min_size=50, max_size=400),
       sustain=st.integers(1, 6), rate=st.floats(1, 1000))
def test_one_step_is_never_a_growth_rate(step_at: float, height: float, level: float,
                                         gaps: list[float], sustain: int, rate: float) -> None:
    """A cache that fills once (any size, any time, any sampling gaps) is the growth limit's
    business, not the rate's: the rate rule asks both halves of the window to grow."""
    cfg = replace(BASE, sustain=sustain, gpu_growth_rate=rate)
    s, t = new_state(0.0), 0.0
    for gap in gaps:
        t += gap
        s, verdict = observe(s, cfg, t, level + (height if t >= step_at else 0.0), None,
                             "nvml-process")
        assert verdict is None, (t, verdict)


@settings(max_examples=150, deadline=None)
@given(kinds=st.lists(st.sampled_from(["nvml-process", "nvml-device", "host"]), min_size=1,
                      max_size=80),
       sustain=st.integers(1, 6), growth=st.floats(1, 1e4), rate=st.floats(1, 1e4))
def test_a_steady_tree_read_different_ways_never_fires_growth(
        kinds: list[str], sustain: int, growth: float, rate: float) -> None:
    """Each kind of figure is steady, but they differ by far more than the limits."""
    figure = {"nvml-process": 60_000.0, "nvml-device": 62_500.0, "host": 264.0}
    cfg = replace(BASE, sustain=sustain, baseline_delay=0, slope_window=600,
                  gpu_growth_limit=growth, gpu_growth_rate=rate)
    s = new_state(0.0)
    for i, kind in enumerate(kinds):
        s, verdict = observe(s, cfg, 10.0 * i, figure[kind], None, kind)
        assert verdict is None, (i, kind, verdict)
        assert s.gpu.baseline in (None, figure[s.gpu.source or "host"])
