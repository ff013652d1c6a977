"""Pure: a memory restart that waits for `restart.quiet_hours`.

A growth rule that holds outside the window holds at every sample until the window opens:
a hold from 09:00 to 02:00 at a 10 s sample interval is ~6000 samples. The journal gets the
hold when it begins and then once an hour (`memory.rule_held`), and its end when the rule
stops holding (`memory.hold_ended`); `vllmwatch status` shows it while it lasts. A rule that
flaps (holds, then not for a sample, then again) logs no more: a hold's end is logged only
when its beginning was, and a beginning at most once an hour per rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllmwatch.config.units import in_window
from vllmwatch.core.actions import Action, Log
from vllmwatch.core.leak import LeakVerdict

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


def judge(w: Waiting, verdict: LeakVerdict | None, quiet_hours: str, minute_of_day: int,
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
