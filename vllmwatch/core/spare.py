"""Pure: the spare's moves as the daemon meets them (issue 34 points 2-4); its track, actions
and events are core/failover.py, the design is in core/restart.py's docstring.

core/ladder.py calls these, and imports this module only when `WatchState.spare` is set (the
shell's plan turned the spare on). Nothing here launches the full engine: a function whose
answer may start it returns `launch` and the ladder spawns.
"""

from __future__ import annotations

from dataclasses import replace

from vllmwatch.core.actions import Action, Log
from vllmwatch.core.events import Event
from vllmwatch.core.failover import (
    BUILD_TIMEOUT,
    SLEEP_TIMEOUT,
    STEADY,
    BuildSpare,
    Inputs,
    Route,
    SleepSpare,
    SpareBuilt,
    SpareChecked,
    SpareExited,
    SpareSlept,
    SpareWoken,
    StopSpare,
    WakeSpare,
    changed,
    checked,
    fails_over,
    fields,
    move,
    off,
)
from vllmwatch.core.failover import Rung as R
from vllmwatch.core.names import FAILURE_REASONS, Reason
from vllmwatch.core.restart import Phase, on
from vllmwatch.core.restart import goto as rung
from vllmwatch.core.sparetrack import answered, down, ended, put, rebuild, serving_idle, track
from vllmwatch.core.state import Result, S, WatchState, goto

Moved = tuple[WatchState, list[Action], bool]  # ..., whether the full engine launches now


def building(s: WatchState) -> bool:
    """Whether a build of the spare is under way (its answer is awaited)."""
    return s.spare is not None and s.spare.rung == R.BUILDING


def build_first(s: WatchState, now: float) -> Result | None:
    """Before the first launch: the spare is built on the empty GPU, reaches its canary and
    sleeps; the full engine starts after it (SpareBuilt). None: not wanted here."""
    t = s.spare
    if t is None or not t.wanted or t.rung != R.OFF or s.gen > 0 or s.exit_code is not None:
        return None
    acts: list[Action] = []
    if s.state != S.PREWARMING:
        s, acts = goto(s, S.PREWARMING, now, "build the spare before the first launch")
    s, more = rung(s, Phase.SPARE_BUILD, now, "the spare is built first on the empty GPU")
    t, logs = move(t, R.BUILDING, now, "first start")
    return put(s, t, [*acts, *more, *logs, BuildSpare(BUILD_TIMEOUT, t.build)])


@answered
def restart_begins(s: WatchState, now: float, reason: Reason) -> tuple[WatchState, list[Action],
                                                                        str]:
    """A restart begins: wake the spare at once (before the record and the take-down) when
    it is armed and the GPU stays usable. The text is restart.begin's `failover` field."""
    t = track(s)
    if t.rung == R.BUILDING and not on(s, Phase.SPARE_BUILD):
        # A rebuild beside the serving engine: it goes, and is built again at the relaunch's
        # READY. Never two engines starting side by side (the relaunch's startup plan and
        # CUDA graphs would measure a GPU the half-built spare moves under them).
        why = f"restart ({reason}) during its rebuild: built again at the next READY"
        t = replace(t, pid=None, stale="", began=None, late=False, failed_builds=t.failed_builds
                    + (reason in FAILURE_REASONS))  # the rebuild's doing (OOM)? it counts
        t, acts = off(t, now, why) if t.failed_builds >= t.retries else \
            move(t, R.DOWN, now, why)
        return replace(s, spare=t), [*acts, StopSpare(why)], \
            "none: the spare was being rebuilt (stopped; built again at the next READY)"
    yes, words = fails_over(t, reason)
    if yes and t.rung == R.RETURNING:  # awake, draining to sleep: woken again once asleep
        t = replace(t, began=now, late=True)
        return replace(s, spare=t), [Log("warning", "failover.begin", {
            "build": t.build, "reason": str(reason), "deferred": "the spare is going back "
            "to sleep after the last failover: woken as soon as it sleeps"})], words
    if not yes:
        return s, [], words
    t, acts = move(replace(t, began=now, late=False), R.WAKING, now, f"restart: {reason}")
    acts += [Log("warning", "failover.begin", {"build": t.build, "reason": str(reason)}),
             WakeSpare(s.config.spare.wake_timeout)]
    return (*put(s, t, acts), words)


@answered
def released(s: WatchState, now: float) -> Result:
    """The old tree's GPU memory is back: a wake that found no room beside it goes now."""
    t = track(s)
    if not t.late or t.rung != R.ASLEEP or s.exit_code is not None:
        return s, []
    t, acts = move(t, R.WAKING, now, "the old tree's GPU memory is released")
    return put(s, t, [*acts, WakeSpare(s.config.spare.wake_timeout)])


@answered
def full_ready(s: WatchState, now: float) -> Result:
    """The full engine is READY: route back and re-arm the spare, or rebuild a dead one."""
    t = track(s)
    if t.rung == R.SERVING:
        acts: list[Action] = [Route("full"), Log("info", "failover.returned", fields(t, now))]
        t, more = move(replace(t, began=None, served_at=None, late=False), R.RETURNING, now,
                       "the full engine is READY")
        drain = s.config.restart.drain_timeout
        return put(s, t, [*acts, *more, SleepSpare(drain, SLEEP_TIMEOUT + drain)])
    if t.rung == R.DOWN and t.wanted:
        return rebuild(s, t, now, "rebuilt beside the serving engine")
    if t.rung == R.ASLEEP and t.stale:  # a reload changed its command while it was out
        return down(s, replace(t, late=False, began=None), now, t.stale)
    if t.rung == R.ASLEEP and t.late:  # the wake never found room: the failover is over
        return put(s, replace(t, late=False, began=None), [])
    return s, []


@answered
def halted(s: WatchState, now: float) -> Result:
    """vllmwatch is leaving: the spare's tree goes down with the rest, from any rung."""
    t = track(s)
    if t.rung == R.OFF:
        return s, [StopSpare("vllmwatch is stopping")]  # a build answer may be out
    back: list[Action] = [Route("full")] if t.rung == R.SERVING else []  # never routed to
    t, acts = move(t, R.OFF, now, "vllmwatch is stopping")  # a tree that is stopped
    why = "vllmwatch is stopping"  # (a failover under way ends: failover.failed, answered)
    return put(s, replace(t, why=why, pid=None, began=None, late=False),
               [*back, *acts, StopSpare(why)])


@answered
def reloaded(s: WatchState, now: float, changed: str = "", inputs: Inputs = (),
             relaunch: bool = True) -> Result:
    """A reload (s.config is the new one). `changed`: why the spare's command changed ("":
    it did not); one that runs the old command is stopped and rebuilt from the new config (the
    shell re-plans it at BuildSpare): at once when nothing waits on it, else at its answer.
    `spare.enabled = false` turns it off; any other reload turns back on a spare turned off.
    `inputs`: what a spare built now would run (a build out now read its files before);
    `relaunch`: the serving engine is relaunched too (else an asleep spare is rebuilt now)."""
    t = track(s)
    if s.exit_code is not None:
        return s, []
    if t.retries != max(1, s.config.spare.retries):  # reloadable: the next failure counts it
        s = replace(s, spare=replace(t, retries=max(1, s.config.spare.retries)))
        t = track(s)
    if inputs and t.rung == R.BUILDING:
        s = replace(s, spare=replace(t, want=inputs))
        t = track(s)
    if s.config.spare.enabled == "false":
        if t.rung == R.OFF and not t.wanted:
            return s, []
        why = "spare.enabled = false (config reloaded)"
        if t.rung == R.OFF:  # not built yet (or a build answer may still be out)
            return put(s, replace(t, wanted=False, why=why, stale=""), [StopSpare(why)])
        t, acts = move(replace(t, wanted=False, why=why, stale="", began=None, late=False,
                               pid=None), R.OFF, now, why)  # its tree is stopped: no pid
        back: list[Action] = [Route("full")] if track(s).rung == R.SERVING else \
            ended(track(s), f"turned off while {track(s).rung}: {why}")
        return put(s, t, [*back, *acts, StopSpare(why)])
    if not t.wanted and t.rung == R.OFF:
        t, acts = move(replace(t, wanted=True, failed_builds=0, lost=0, stale="", why=""),
                       R.DOWN, now, "config reloaded")
        if serving_idle(s):
            s, more = rebuild(s, t, now, "config reloaded")
            return s, acts + more
        return put(s, t, acts)
    if not changed or t.rung in (R.OFF, R.DOWN):  # a later build reads the new config
        return s, []
    why = f"config reloaded: {changed}"
    log = Log("info", "spare.rebuilt", {"build": t.build, "why": why, "rung": str(t.rung)})
    if t.rung == R.ASLEEP and not relaunch:  # the serving engine stays: rebuilt beside it
        s, acts = down(s, replace(t, began=None, late=False), now, why)
        return s, [log, *acts]
    if t.rung == R.ASLEEP:  # nothing waits on it: it goes now, rebuilt at the READY of the
        # serving engine the reload relaunches (never two engines starting side by side)
        t, acts = move(replace(t, pid=None, began=None, late=False), R.DOWN, now, why)
        return put(s, t, [log, *acts, StopSpare(why)])
    # building, waking, serving or returning: its answer (or the return) is awaited first
    return put(s, replace(t, stale=why), [log])


@answered
def event(s: WatchState, ev: Event, now: float) -> Moved:
    """One of the spare's events (failover.SPARE_EVENTS)."""
    if isinstance(ev, SpareBuilt):
        return _built(s, ev, now)
    if isinstance(ev, SpareWoken):
        return (*_woken(s, ev, now), False)
    if isinstance(ev, SpareSlept):
        return (*_slept(s, ev, now), False)
    if isinstance(ev, SpareExited):
        return (*_exited(s, ev, now), False)
    if isinstance(ev, SpareChecked):
        return (*_checked(s, ev, now), False)
    return s, [], False


def _checked(s: WatchState, ev: SpareChecked, now: float) -> Result:
    t, hung = checked(track(s), ev, s.config.probe.failure_threshold)
    if not hung:
        return put(s, t, [])
    acts: list[Action] = [Route("full"), Log("error", "spare.hung_serving", {
        "build": t.build, "detail": hung, "then": "stopped (its requests cut, replayed where "
        "safe); nobody serves until the full engine is READY"})]
    s, more = down(s, replace(t, began=None, served_at=None, late=False), now, hung)
    return s, acts + more


def _built(s: WatchState, ev: SpareBuilt, now: float) -> Moved:
    t = track(s)
    first = on(s, Phase.SPARE_BUILD)
    if ev.build and ev.build != t.build:  # an earlier build's late answer: its tree is gone
        return s, [], False  # (a StopSpare now would stop the build under way)
    if t.rung != R.BUILDING:  # stopped while it was built: nothing of it may stay
        return s, [StopSpare("built after it was given up")] if ev.ok else [], False
    if ev.ok and t.want and not t.stale and changed(ev.inputs, t.want):  # a reload since
        t = replace(t, stale=f"config reloaded: {changed(ev.inputs, t.want)}")  # it began
    t = replace(t, want=())
    if ev.deferred:  # the serving engine has no room for it until its next launch
        t, acts = move(t, R.DOWN, now, "built after the serving engine's next launch")
        acts.append(Log("warning", "spare.deferred", {"build": t.build, "detail": ev.detail}))
        return (*put(s, t, acts), first)
    if ev.ok and t.dead is not None and t.dead[0] == ev.pid:  # reaped before this answer
        ev = replace(ev, ok=False, detail=f"its tree exited as its build ended: {t.dead[1]}")
    t = replace(t, dead=None)
    if ev.ok and t.stale:  # built from the command before a reload: rebuilt from the new
        t = replace(t, failed_builds=0, pid=ev.pid)
        s, acts = down(s, t, now, t.stale)  # (rebuilt at the full engine's READY)
        return s, acts, first  # a first start's full engine launches now
    if ev.ok:
        t = replace(t, failed_builds=0, pid=ev.pid, awake_mib=ev.awake_mib,
                    asleep_mib=ev.asleep_mib, built_from=ev.inputs, built_at=now)
        t, acts = move(t, R.ASLEEP, now, "built, passed its canary, asleep")
        acts.append(Log("info", "spare.ready", {
            "build": t.build, "pid": ev.pid, "awake_mib": ev.awake_mib,
            "asleep_mib": ev.asleep_mib}))
        return (*put(s, t, acts), first)
    t = replace(t, failed_builds=t.failed_builds + 1, pid=None)
    acts = [StopSpare("its build failed"), Log("warning", "spare.build_failed", {
        "build": t.build, "detail": ev.detail, "failed_builds": t.failed_builds,
        "retries": t.retries})]
    if t.failed_builds >= t.retries or ev.permanent:  # (a first start's engine launches)
        t, more = off(t, now, ev.detail, ev.permanent)
        return (*put(s, t, acts + more), first)
    if first:  # the serving engine never waits on a second try (spare.retries x the build's
        # timeout, half an hour for a hanging build): it launches now with the plan's room,
        # and the spare is tried again beside it at its READY
        t, more = move(t, R.DOWN, now, "its first build failed: tried again beside the "
                       "serving engine at its READY")
        return (*put(s, t, acts + more), True)
    if serving_idle(s):  # another try at once beside the READY engine
        s, more = rebuild(s, t, now, f"build {t.failed_builds + 1} of {t.retries}")
        return s, acts + more, False
    t, more = move(t, R.DOWN, now, "its build failed: another try at the next READY")
    return (*put(s, t, acts + more), False)


def _woken(s: WatchState, ev: SpareWoken, now: float) -> Result:
    t = track(s)
    if t.rung != R.WAKING:
        return s, []
    if ev.ok and serving_idle(s):  # the full engine came back first: straight back to sleep
        t, acts = move(t, R.RETURNING, now, "awake after the full engine was READY")
        drain = s.config.restart.drain_timeout
        return put(s, replace(t, began=None), [*acts, SleepSpare(drain, SLEEP_TIMEOUT)])
    if ev.ok:
        took = now - t.began if t.began is not None else 0.0
        t = replace(t, served_at=now, failovers=t.failovers + 1, last_seconds=round(took, 3),
                    unanswered=0)
        t, acts = move(t, R.SERVING, now, "awake: /is_sleeping false and its canary passed")
        acts += [Route("spare"), Log("warning", "failover.served", {
            "seconds": round(took, 3), "wake_s": round(ev.seconds, 3), **fields(t, now)})]
        return put(s, t, acts)
    if ev.no_room and not t.late and not serving_idle(s):
        after = s.restart.phase in (Phase.PREWARMING, Phase.BACKOFF, Phase.LAUNCHING)
        t, acts = move(replace(t, late=True), R.ASLEEP, now, "no room beside the old tree")
        acts.append(Log("info", "failover.deferred", {
            "build": t.build, "detail": ev.detail,
            "then": "wakes right after the old tree's GPU release"}))
        if after:  # that release is already behind us
            s, more = released(replace(s, spare=t), now)
            return s, acts + more
        return put(s, t, acts)
    log = Log("warning", "failover.failed", {
        "build": t.build, "detail": ev.detail, "then": "the restart proceeds without the spare"})
    if ev.no_room:  # it is still asleep and healthy: armed for the next restart
        t, acts = move(replace(t, late=False, began=None), R.ASLEEP, now, "no room")
        return put(s, t, [*acts, log])
    s, acts = down(s, replace(t, began=None, late=False), now, f"wake failed: {ev.detail}")
    return s, [log, *acts]


def _slept(s: WatchState, ev: SpareSlept, now: float) -> Result:
    t = track(s)
    if t.rung != R.RETURNING:
        return s, []
    if ev.ok and t.stale:
        return down(s, t, now, t.stale)
    if ev.ok:
        t, acts = move(t, R.ASLEEP, now, "re-armed")
        acts.append(Log("info", "spare.rearmed", {"build": t.build,
                                                  "seconds": round(ev.seconds, 3)}))
        if t.late and not serving_idle(s):  # a restart began while it went back to sleep:
            # woken now, as a first wake (no room beside the dying tree: its release awaited)
            s, more = released(replace(s, spare=t), now)
            return put(s, replace(track(s), late=False), acts + more)
        return put(s, replace(t, late=False, began=None), acts)
    why = f"could not sleep again: {ev.detail}"  # (a deferred failover ends with it)
    s, acts = down(s, replace(t, late=False, began=None), now, why)
    return s, ended(t, why) + acts


def _exited(s: WatchState, ev: SpareExited, now: float) -> Result:
    t = track(s)
    if t.rung == R.BUILDING and t.pid is None:  # its build's answer is still out: kept
        return put(s, replace(t, dead=(ev.pid, ev.detail)), [])  # for _built to compare
    if t.pid is None or ev.pid != t.pid or t.rung in (R.OFF, R.DOWN, R.BUILDING):
        return s, []
    acts: list[Action] = []
    if t.rung == R.SERVING:
        acts = [Route("full"), Log("error", "spare.died_serving", {
            "build": t.build, "detail": ev.detail,
            "then": "nobody serves until the full engine is READY"})]
    else:
        acts = [Log("warning", "spare.died", {"build": t.build, "rung": str(t.rung),
                                              "detail": ev.detail})]
        acts += ended(t, f"the spare died ({t.rung}): {ev.detail}")
    early = t.built_at is not None and now - t.built_at < STEADY
    t = replace(t, began=None, served_at=None, late=False, lost=t.lost + 1 if early else 0)
    if t.lost < t.retries:
        s, more = down(s, t, now, f"died: {ev.detail}")
        return s, acts + more
    why = (f"died {t.lost} times in a row, each within {STEADY:.0f} s of its build "
           f"(spare.retries): off until the next reload")
    t, more = move(replace(t, wanted=False, why=why, pid=None), R.OFF, now, why)
    return put(s, t, [*acts, *more, StopSpare(why), Log("warning", "spare.off", {
        "build": t.build, "why": why, "last_error": ev.detail,
        "hint": "read the spare's lines above (the host's OOM killer: journalctl -k), fix "
                "the cause, then reload (SIGHUP)"})])

