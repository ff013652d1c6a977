"""Pure: the spare's track in the daemon's state, and the two moves every spare handler
ends in (rebuilt, or down); core/spare.py's helpers, imported with it (only when the spare
is on)."""

from __future__ import annotations

from dataclasses import replace

from vllmwatch.core.actions import Action
from vllmwatch.core.failover import BUILD_TIMEOUT, BuildSpare, StopSpare, Track, move
from vllmwatch.core.failover import Rung as R
from vllmwatch.core.restart import Phase, on
from vllmwatch.core.state import Result, S, WatchState


def track(s: WatchState) -> Track:
    assert s.spare is not None, "no spare track"
    return s.spare


def put(s: WatchState, t: Track, acts: list[Action]) -> Result:
    return replace(s, spare=t), acts


def serving_idle(s: WatchState) -> bool:
    return s.state == S.READY and on(s, Phase.IDLE) and s.exit_code is None


def rebuild(s: WatchState, t: Track, now: float, why: str) -> Result:
    t, acts = move(replace(t, pid=None, stale="", dead=None), R.BUILDING, now, why)
    return put(s, t, [*acts, BuildSpare(BUILD_TIMEOUT, t.build)])


def down(s: WatchState, t: Track, now: float, why: str) -> Result:
    """Dead or broken: its tree goes, and it is rebuilt at once beside a READY engine (it
    fits by construction), else at the full engine's READY."""
    t, acts = move(replace(t, pid=None), R.DOWN, now, why)
    acts.append(StopSpare(why))
    if serving_idle(s) and t.wanted:
        s, more = rebuild(s, t, now, "rebuilt beside the serving engine")
        return s, acts + more
    return put(s, t, acts)
