"""Pure leak rules over memory samples: absolute limit, growth above a baseline, growth rate.

No I/O and no clock reads: the loop passes `now` (monotonic seconds) and the figures (MiB).
Each rule is off at 0 and fires only after it has held for `memory.sustain` consecutive
samples; the rate rule after `sustain` consecutive refits of its slope (a sample closer than
window/MAX_POINTS to the last point adds none and moves no streak: at the defaults, 10 s
samples and 21 s points, three samples were one slope). Why the growth rate is spike- and
step-resistant:
- it is a least-squares slope over a median-filtered series (width 2*sustain+1), so a spike
  shorter than `sustain` points cannot move it;
- it needs the window at least half full and points after the baseline only, so the start-up
  ramp is never read as a leak;
- both halves of the window must also grow at >= half the rate, so a one-off step (a cache
  filling once) does not look like steady growth; the growth limit is the rule for steps.
A growth or rate verdict outside restart.quiet_hours waits: judge_hold (at the end).

The GPU series keeps one kind of figure (`source`, core/samples.gpu_kind): the sampler's
fallbacks read the same tree as the tree's NVML sum, the whole device's use or the host's
PSS, figures that differ by the model's size. A sample of another kind is unknown to the
series (a glitch at the baseline sample made a steady tree look 60 GB grown: a false
restart); a kind that lasts `sustain` samples starts the series again on it (restarted_log).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from vllmwatch.config.schema import MemoryConfig
from vllmwatch.config.units import in_window
from vllmwatch.core.actions import Action, Log
from vllmwatch.core.names import Reason

MAX_POINTS = 1024  # points kept per series: the window is sampled at window/MAX_POINTS at most
_MAX_HALF_WIDTH = 10  # cap on the median filter's half width (sustain may be large)

Point = tuple[float, float]  # (monotonic seconds, MiB)


@dataclass(frozen=True)
class SeriesState:
    """One figure's history: baseline, slope window, and the streak of each rule."""

    baseline: float | None = None
    source: str | None = None  # the kind of figure the series holds (GPU series only)
    other: tuple[str, int] | None = None  # another kind seen last, and for how many samples
    points: tuple[Point, ...] = ()
    slope: float | None = None  # MiB/h over the whole window, filtered
    half_slopes: tuple[float, float] | None = None  # MiB/h of the older and newer half
    limit_streak: int = 0
    growth_streak: int = 0
    rate_streak: int = 0


@dataclass(frozen=True)
class LeakState:
    """Leak-rule state of one child run; make a new one at each READY."""

    ready_at: float
    gpu: SeriesState = SeriesState()
    host: SeriesState = SeriesState()


@dataclass(frozen=True)
class LeakVerdict:
    """A rule that has held for `sustain` samples: restart with `reason`."""

    reason: Reason  # GPU_MEMORY | HOST_MEMORY
    rule: str  # gpu_limit | gpu_growth_limit | gpu_growth_rate | host_... (the config key)
    value: float  # MiB, MiB above baseline, or MiB/h
    limit: float
    waits_for_quiet_hours: bool  # absolute limits never wait
    detail: str


@dataclass(frozen=True)
class _Rules:
    kind: str  # gpu | host
    limit: float
    growth_limit: float
    rate: float


def new_state(ready_at: float) -> LeakState:
    """Fresh state for a child that became READY at monotonic time ready_at."""
    return LeakState(ready_at=ready_at)


def observe(state: LeakState, cfg: MemoryConfig, now: float, gpu_mib: float | None,
            host_mib: float | None, gpu_source: str | None = None
            ) -> tuple[LeakState, LeakVerdict | None]:
    """Take one sample (None: unknown, leaves that series as it was); return a verdict if any.

    `gpu_source`: the kind of gpu_mib (core/samples.gpu_kind; None: not tracked).
    A verdict that must not wait (absolute limit) wins over one that may; GPU before host.
    """
    series, gpu_mib = _follow(state.gpu, gpu_source, gpu_mib, cfg.sustain)
    gpu, gpu_v = _observe_one(series, _rules(cfg, "gpu"), cfg, state.ready_at, now, gpu_mib)
    host, host_v = _observe_one(state.host, _rules(cfg, "host"), cfg, state.ready_at, now,
                                host_mib)
    verdicts = gpu_v + host_v
    urgent = [v for v in verdicts if not v.waits_for_quiet_hours]
    chosen = (urgent or verdicts)[:1]
    return replace(state, gpu=gpu, host=host), chosen[0] if chosen else None


def figures(state: LeakState) -> tuple[float | None, float | None, float | None, float | None]:
    """(gpu_baseline, host_baseline, gpu_slope, host_slope) for MemoryFigures; MiB and MiB/h."""
    return state.gpu.baseline, state.host.baseline, state.gpu.slope, state.host.slope


def slope_per_hour(points: Sequence[Point]) -> float | None:
    """Least-squares slope in MiB/h of (seconds, MiB) points; None under 2 distinct times."""
    n = len(points)
    if n < 2:
        return None
    t_mean = sum(t for t, _ in points) / n
    v_mean = sum(v for _, v in points) / n
    # Centred sums: monotonic seconds are large, so uncentred ones would lose precision.
    sxx = sum((t - t_mean) ** 2 for t, _ in points)
    if sxx <= 0.0:
        return None
    sxy = sum((t - t_mean) * (v - v_mean) for t, v in points)
    return sxy / sxx * 3600.0


def median_filter(points: Sequence[Point], half: int) -> list[Point]:
    """Centred running median of width 2*half+1; the `half` points at each end are dropped."""
    if half <= 0:
        return list(points)
    values = [v for _, v in points]
    return [(points[i][0], statistics.median(values[i - half:i + half + 1]))
            for i in range(half, len(points) - half)]


def _follow(s: SeriesState, source: str | None, value: float | None, sustain: int
            ) -> tuple[SeriesState, float | None]:
    """The series and the value it takes: None (unknown) for a figure of another kind until
    that kind has lasted `sustain` samples in a row; then a new series of that kind."""
    if source is None or value is None:
        return s, value
    if s.source is None or s.source == source:
        return replace(s, source=source, other=None), value
    seen = s.other[1] + 1 if s.other is not None and s.other[0] == source else 1
    if seen < sustain:
        return replace(s, other=(source, seen)), None
    return SeriesState(source=source), value


def restarted_log(old: LeakState, new: LeakState) -> list[Action]:
    """`memory.series_restarted` when the GPU series started again on another kind."""
    was, now_s = old.gpu, new.gpu
    if was.source is None or now_s.source == was.source:
        return []
    return [Log("warning", "memory.series_restarted", {
        "source": now_s.source, "previous": was.source,
        "previous_baseline_mib": was.baseline, "previous_slope_mib_h": was.slope,
        "span_lost_s": round(was.points[-1][0] - was.points[0][0], 1) if was.points else 0.0,
        "detail": "the GPU figure is now read another way (an NVML read keeps failing, "
                  "see memory.source): growth is measured from a new baseline"})]


def _rules(cfg: MemoryConfig, kind: str) -> _Rules:
    if kind == "gpu":
        return _Rules("gpu", cfg.gpu_limit, cfg.gpu_growth_limit, cfg.gpu_growth_rate)
    return _Rules("host", cfg.host_limit, cfg.host_growth_limit, cfg.host_growth_rate)


def _observe_one(s: SeriesState, rules: _Rules, cfg: MemoryConfig, ready_at: float, now: float,
                 value: float | None) -> tuple[SeriesState, list[LeakVerdict]]:
    if value is None:
        return s, []
    if s.baseline is None and now >= ready_at + cfg.baseline_delay:
        s = replace(s, baseline=value)
    points = s.points
    if s.baseline is not None:
        s = _add_point(s, cfg, now, value)
    refit = s.points is not points  # no new point: the slope is the one already judged
    growth = None if s.baseline is None else value - s.baseline
    rate = rules.rate > 0 and _rate_holds(s, rules.rate)  # (a reload may change the rule)
    s = replace(
        s,
        limit_streak=_streak(s.limit_streak, rules.limit > 0 and value > rules.limit),
        growth_streak=_streak(s.growth_streak, rules.growth_limit > 0 and growth is not None
                              and growth > rules.growth_limit),
        rate_streak=_streak(s.rate_streak, rate) if refit or not rate else s.rate_streak,
    )
    return s, _verdicts(s, rules, cfg.sustain, value, growth)


def _streak(old: int, holds: bool) -> int:
    return old + 1 if holds else 0


def _rate_holds(s: SeriesState, rate: float) -> bool:
    if s.slope is None or s.half_slopes is None:
        return False
    return s.slope > rate and min(s.half_slopes) > rate / 2


def _add_point(s: SeriesState, cfg: MemoryConfig, now: float, value: float) -> SeriesState:
    """Append a point (at most one per window/MAX_POINTS), trim to the window, refit."""
    window = cfg.slope_window
    if s.points and now - s.points[-1][0] < window / MAX_POINTS:
        return s
    points = (*(p for p in s.points if p[0] >= now - window), (now, value))
    points = points[-2 * MAX_POINTS:]  # a bound even if the clock misbehaves
    slope, halves = _fit(points, window, min(cfg.sustain, _MAX_HALF_WIDTH))
    return replace(s, points=points, slope=slope, half_slopes=halves)


def _fit(points: Sequence[Point], window: float, half: int
         ) -> tuple[float | None, tuple[float, float] | None]:
    """Slope of the whole window and of each half, once the window is at least half full."""
    if len(points) < 3 or points[-1][0] - points[0][0] < window / 2:
        return None, None
    smooth = median_filter(points, half)
    if len(smooth) < 6:
        return None, None
    mid = len(smooth) // 2
    slope, older, newer = (slope_per_hour(smooth), slope_per_hour(smooth[:mid]),
                           slope_per_hour(smooth[mid:]))
    if slope is None or older is None or newer is None:
        return None, None
    return slope, (older, newer)


def _verdicts(s: SeriesState, rules: _Rules, sustain: int, value: float,
              growth: float | None) -> list[LeakVerdict]:
    reason, k, what = Reason(f"{rules.kind}_memory"), rules.kind, f"{rules.kind.upper()} memory"
    held = f"for {sustain} samples"
    out = []
    if s.limit_streak >= sustain:
        out.append(LeakVerdict(reason, f"{k}_limit", value, rules.limit, False,
                               f"{what} {value:.0f} MiB > {k}_limit {_fig(rules.limit)} MiB "
                               f"{held}"))
    if s.growth_streak >= sustain and growth is not None:
        out.append(LeakVerdict(
            reason, f"{k}_growth_limit", growth, rules.growth_limit, True,
            f"{what} {value:.0f} MiB is {growth:.0f} MiB above its baseline "
            f"{s.baseline:.0f} MiB > {k}_growth_limit {_fig(rules.growth_limit)} MiB {held}"))
    if s.rate_streak >= sustain and s.slope is not None and s.half_slopes is not None:
        span_h = (s.points[-1][0] - s.points[0][0]) / 3600
        out.append(LeakVerdict(
            reason, f"{k}_growth_rate", s.slope, rules.rate, True,
            f"{what} grows {_fig(s.slope)} MiB/h over the last {span_h:.2f} h (halves "
            f"{_fig(s.half_slopes[0])}, {_fig(s.half_slopes[1])} MiB/h) > {k}_growth_rate "
            f"{_fig(rules.rate)} MiB/h for {sustain} fits of the slope"))
    return out


def _fig(v: float) -> str:
    """A rule's figure as a person reads it: whole from 100 up, else 3 digits. `:.3g` wrote
    a 3600 MiB/h leak "3.6e+03 MiB/h" and `:g` a 1 TiB host_limit "1.04858e+06 MiB"."""
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


# ---- a growth restart waiting for restart.quiet_hours ----------------------------------------
# A growth rule that holds outside the window holds at every sample until the window opens: a
# hold from 09:00 to 02:00 at a 10 s sample interval is ~6000 samples. The journal gets the
# hold when it begins and then once an hour (`memory.rule_held`), and its end when the rule
# stops holding (`memory.hold_ended`); `vllmwatch status` shows it while it lasts. A rule that
# flaps (holds, then not for a sample, then again) logs no more: a hold's end is logged only
# when its beginning was, and a beginning at most once an hour per rule.

REMIND_S = 3600.0  # a hold that lasts is logged again after this long


@dataclass(frozen=True)
class Hold:
    """A memory restart waiting for the quiet hours."""

    rule: str  # the config key of the rule that holds (gpu_growth_limit, ...)
    since: float  # monotonic: the first sample it held outside the window
    logged: bool  # its beginning was logged (then its end is too)
    detail: str = ""


@dataclass(frozen=True)
class Waiting:
    """The hold now, and when `memory.rule_held` was last logged for each rule (monotonic)."""

    hold: Hold | None = None
    logged_at: tuple[tuple[str, float], ...] = ()


def judge_hold(w: Waiting, verdict: LeakVerdict | None, quiet_hours: str, minute_of_day: int,
          now: float) -> tuple[Waiting, list[Action], bool]:
    """(the new record, what to log, whether `verdict` restarts now)."""
    if verdict is None:
        return _ended(w, now)
    if not verdict.waits_for_quiet_hours or in_window(quiet_hours, minute_of_day):
        return Waiting(None, w.logged_at), [], True
    old = w.hold
    since = old.since if old is not None else now
    last = dict(w.logged_at).get(verdict.rule)
    if last is not None and now - last < REMIND_S:
        logged = old is not None and old.logged
        return Waiting(Hold(verdict.rule, since, logged, verdict.detail), w.logged_at), [], False
    logged_at = (*((r, t) for r, t in w.logged_at if r != verdict.rule), (verdict.rule, now))
    return Waiting(Hold(verdict.rule, since, True, verdict.detail), logged_at), [
        Log("info", "memory.rule_held", {
            "rule": verdict.rule, "detail": verdict.detail, "quiet_hours": quiet_hours,
            "held_s": round(now - since, 1),
            "next": f"the restart waits for the quiet hours {quiet_hours}; this is logged "
                    "again each hour it still waits"})], False


def _ended(w: Waiting, now: float) -> tuple[Waiting, list[Action], bool]:
    hold = w.hold
    if hold is None:
        return w, [], False
    acts: list[Action] = []
    if hold.logged:
        acts.append(Log("info", "memory.hold_ended", {
            "rule": hold.rule, "held_s": round(now - hold.since, 1),
            "detail": "the rule no longer holds: no memory restart waits for the quiet "
                      "hours"}))
    return Waiting(None, w.logged_at), acts, False
