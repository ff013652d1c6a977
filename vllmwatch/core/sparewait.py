"""Pure: a launch that waits for a stopped spare's tree to be gone (Phase.SPARE_DOWN).

A spare that is stopped (a reload turned it off, a restart stopped its rebuild) goes down off
the loop's thread (shell/sparestop.py) and holds its GPU memory until it is gone, up to 15 s:
no serving engine launches beside it (vLLM's start-up free-memory check, or a KV cache sized
short). The shell answers such a launch with SpareGoing instead of waiting on the loop's
thread, where no SIGHUP, SIGUSR1 nor WATCHDOG=1 was answered meanwhile; the core waits on
this rung, shown as a backoff, and launches at SpareGone. Everything else is answered as in
a backoff: a stop leaves at once (nothing was launched; the daemon's exit still waits for
the spare's tree), a reload is taken for the launch, SIGUSR1 asks for the launch again. The
rung's deadline asks again too, so no lost SpareGone holds the start (the spare's stop is
bounded: shell/sparetree.STOP_GRACE three times). Imported only when the spare is on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vllmwatch.core.actions import Action, Log
from vllmwatch.core.events import SpareEvent
from vllmwatch.core.restart import Phase, on
from vllmwatch.core.restart import goto as rung
from vllmwatch.core.state import Result, S, WatchState, goto
from vllmwatch.core.stopping import launch_failed

WAIT_S = 20.0  # past the spare's bounded stop (STOP_GRACE three times: 15 s), then ask again


@dataclass(frozen=True)
class SpareGoing(SpareEvent):
    """The shell's answer to a Spawn while a stopped spare's tree still goes down: nothing was
    launched; SpareGone follows once no spare tree is going down."""

    detail: str = ""


@dataclass(frozen=True)
class SpareGone(SpareEvent):
    """No spare's tree is going down any more: a launch that waited for it may go."""


def event(s: WatchState, ev: SpareGoing | SpareGone, now: float
          ) -> tuple[WatchState, list[Action], bool]:
    """(state, actions, whether the launch goes now: ladder.spare_event launches it)."""
    if isinstance(ev, SpareGoing):
        return (*_going(s, ev, now), False)
    # (else a wait that a stop or an earlier SpareGone ended already)
    return s, [], s.state == S.BACKOFF and on(s, Phase.SPARE_DOWN) and s.exit_code is None


def _going(s: WatchState, ev: SpareGoing, now: float) -> Result:
    c = s.child
    if s.state != S.STARTING or c is None or c.proc.spawned:
        return s, []  # the answer is stepped right after its Spawn: never so, but no guess
    # Nothing ran: the launch that follows takes this generation (the memory rules count
    # failed starts of consecutive generations: core/unified.py).
    s = replace(launch_failed(s), gen=s.gen - 1)
    why = "a stopped spare's tree still holds its GPU memory: the launch waits until it is gone"
    s, acts = goto(s, S.BACKOFF, now, why, deadline=now + WAIT_S)
    s, more = rung(s, Phase.SPARE_DOWN, now, why)
    return s, [*acts, *more, Log("info", "launch.waits_for_spare", {
        "detail": ev.detail, "wait_s": WAIT_S})]
