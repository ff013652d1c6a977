"""Pure: the spare's track in the daemon's state, and the two moves every spare handler
ends in (rebuilt, or down); core/spare.py's helpers, imported with it (only when the spare
is on)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from vllmwatch.core.actions import Action, Log
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


# What answers a failover.begin in the journal (`journalctl -g failover`)
ENDS = ("failover.served", "failover.failed", "failover.overtaken")
P = ParamSpec("P")
T = TypeVar("T", bound=tuple[Any, ...])


def under_way(t: Track | None) -> bool:
    """A failover begun and not served yet: waking, or its wake deferred."""
    return t is not None and t.began is not None and t.rung != R.SERVING


def ended(t: Track, detail: str) -> list[Action]:
    """failover.failed for a failover under way that ends without the spare (dead, turned
    off, could not sleep again before a deferred wake); [] when none is under way."""
    return [Log("warning", "failover.failed", {
        "build": t.build, "detail": detail, "then": "the restart proceeds without the spare"})
            ] if under_way(t) else []


def answered(fn: Callable[Concatenate[WatchState, P], T]
             ) -> Callable[Concatenate[WatchState, P], T]:
    """Every failover.begin is answered: a handler of the spare's track (its first item the
    new state, its second the actions) that ends a failover under way without saying so gets
    the answer here, in one place for every path (a path added later too): failover.overtaken
    when the full engine was READY first (the spare stays armed; nothing is wrong), else
    failover.failed with the track's why. Before, `journalctl -g failover` showed a begin that
    never ended when the relaunch won the race, and at a reload or an exit meanwhile."""
    @functools.wraps(fn)
    def wrapped(s: WatchState, /, *args: P.args, **kwargs: P.kwargs) -> T:
        out = fn(s, *args, **kwargs)
        before, after = s.spare, out[0].spare
        acts: list[Action] = out[1]
        if before is None or after is None or not under_way(before) or under_way(after) \
                or after.rung == R.SERVING or any(
                    isinstance(a, Log) and a.event in ENDS for a in acts):
            return out
        if serving_idle(out[0]) and after.rung in (R.ASLEEP, R.RETURNING):
            end: list[Action] = [Log("info", "failover.overtaken", {
                "build": after.build, "detail": "the full engine was READY before the spare "
                "served: clients stay on it; the spare goes back to sleep, armed"})]
        else:
            end = ended(before, "vllmwatch is stopping" if out[0].exit_code is not None else
                        f"the spare is {after.rung}: {after.down_why or after.why}")
        return cast(T, (out[0], [*acts, *end], *out[2:]))
    return wrapped
