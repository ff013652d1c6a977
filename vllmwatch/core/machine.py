"""Pure: step(state, event, now) -> (state, actions). The supervisor's whole brain."""

from __future__ import annotations

from dataclasses import replace

from vllmwatch.config.schema import Config
from vllmwatch.core import gpufault, hangs, ladder, probing, restart, serving, stopping, unified
from vllmwatch.core import hangverdicts as verdicts
from vllmwatch.core.actions import Action, Log, Notify, SignalGroup
from vllmwatch.core.events import (
    CanaryResult,
    ChildExited,
    ChildOutput,
    Event,
    HealthResult,
    IncidentRecorded,
    LaunchMayGo,
    LaunchWaits,
    MemorySampled,
    MetricsResult,
    PrewarmDone,
    ReadyzPolled,
    ReleaseChecked,
    ReloadRequested,
    RestartRequested,
    SmokeResult,
    Spawned,
    SpawnFailed,
    StopRequested,
    SweepDone,
    Tick,
)
from vllmwatch.core.names import PROBES, Reason
from vllmwatch.core.names import ProbeKind as K
from vllmwatch.core.policy import exit_cause, explain_exit
from vllmwatch.core.restart import Phase, Restart, on, pending
from vllmwatch.core.reuse import disk_full
from vllmwatch.core.state import CHILD_STATES, FINAL, Result, S, Start, WatchState, goto, seeded

EXTEND_EVERY = 10.0  # how often EXTEND_TIMEOUT_USEC is sent while systemd waits for us
EXTEND_BY = 60.0


def initial(config: Config, now: float, seed: int = 0) -> WatchState:
    """The state before anything ran; `seed` feeds the backoff jitter (the shell passes an OS
    random number so a fleet does not restart in lock-step; tests pass a fixed one)."""
    s = WatchState(config=config, since=now, restart=Restart(since=now))  # (not the boot)
    return replace(s, rng=seeded(seed)) if seed else s


def step(s: WatchState, ev: Event, now: float) -> Result:
    """Apply one event, then everything that is due at `now`."""
    if s.state in FINAL:
        return s, []
    s, acts = _apply(s, ev, now)
    if s.state not in FINAL:
        s, more = _due(s, now)
        acts += more
    return s, acts


def _apply(s: WatchState, ev: Event, now: float) -> Result:
    if isinstance(ev, Tick):
        if s.state == S.INIT:
            s, acts = stopping.sweep(s, now, "look for leftovers before the first start")
            return s, [Log("info", "daemon.start", {"config": s.config.path}), *acts]
        return s, []
    if isinstance(ev, (HealthResult, CanaryResult, MetricsResult, MemorySampled)):
        return _result(s, ev, now)
    if isinstance(ev, ChildOutput):
        return serving.child_output(s, ev, now)
    if isinstance(ev, Spawned):
        return _spawned(s, ev)
    if isinstance(ev, SpawnFailed):
        return _spawn_failed(s, ev, now)
    if isinstance(ev, LaunchWaits):  # the rung launch_wait until LaunchMayGo (or its deadline)
        return stopping.launch_waits(s, ev.detail, now)
    if isinstance(ev, LaunchMayGo):
        return ladder.spawn(s, now) if stopping.launch_waiting(s) else (s, [])
    if isinstance(ev, ChildExited):
        return _child_exited(s, ev, now)
    if isinstance(ev, SweepDone):
        if s.state != S.CLEANUP or not on(s, Phase.SWEEPING):
            return s, []
        return ladder.swept(s, now, ev.killed, ev.remaining, ev.port_holder, ev.foreign_vllm,
                            ev.error, ev.killed_what, ev.seen)
    if isinstance(ev, ReleaseChecked):
        if s.state != S.CLEANUP or not on(s, Phase.RELEASE_WAIT):
            return s, []
        return ladder.release_checked(s, now, ev.released, ev.detail)
    if isinstance(ev, PrewarmDone):
        return _prewarm_done(s, ev, now)
    if isinstance(ev, IncidentRecorded):
        return ladder.incident_recorded(s, now, ev)
    if isinstance(ev, StopRequested):
        return ladder.stop_requested(s, ev.signal, now)
    if isinstance(ev, RestartRequested):
        return ladder.manual_restart(s, now)
    if isinstance(ev, SmokeResult):  # only sent when a start has checks: imported then
        from vllmwatch.core import smoke

        s, acts, done = smoke.landed(s, ev)
        return serving.become_ready(s, now, acts) if done else (s, acts)
    if isinstance(ev, ReadyzPolled):
        return replace(s, readyz_tracked=True,
                       readyz_seen_at=now if ev.polled else s.readyz_seen_at), []
    if isinstance(ev, ReloadRequested):  # a SIGHUP: its module only then (import count)
        from vllmwatch.core import reload

        return reload.reloaded(s, ev, now)
    if s.spare is not None:  # the spare's events (core/failover.py): only when it is on
        return ladder.spare_event(s, ev, now)
    return s, []


def _result(s: WatchState, ev: HealthResult | CanaryResult | MetricsResult | MemorySampled,
            now: float) -> Result:
    stale = s.child is None or ev.gen != s.child.gen
    if isinstance(ev, MemorySampled) and ev.sample is not None and ev.sample.gpu_faults and \
            (stale or on(s, Phase.RECORDING)):
        # A GPU fault is the machine's, not the run's: never dropped with a late sample (said
        # once; a lost GPU also kills the engine: its sample lands in that crash's restart)
        return gpufault.react(s, ev.sample.gpu_faults, now)[0]
    if stale:
        return s, []  # about an older child: its run is over
    s = probing.landed(s, probing.kind(ev), ev.gen, now)
    if on(s, Phase.RECORDING):
        return s, []  # the run is being recorded before it is taken down: nothing to judge
    if isinstance(ev, HealthResult):
        return serving.health(s, ev, now)
    if isinstance(ev, CanaryResult):
        return serving.canary(s, ev, now)
    if isinstance(ev, MetricsResult):
        return serving.metrics(s, ev, now)
    return serving.memory(s, ev, now)


def _spawned(s: WatchState, ev: Spawned) -> Result:
    c = s.child
    if c is None or c.proc.spawned:
        return s, []
    s = stopping.launched(s, ev.pid, ev.gpu_before_mib, ev.inputs)
    acts: list[Action] = [Log("info", "child.started", {"pid": ev.pid, "gen": c.gen,
                                                          "command": ev.argv_display,
                                                          "launch": ev.launch})]
    if s.state == S.STOPPING:  # a stop or restart came while the launch was out
        acts.append(SignalGroup("SIGKILL" if on(s, Phase.KILLING) else "SIGTERM"))
    elif s.state not in CHILD_STATES:  # the run was given up while the launch was out
        acts.append(SignalGroup("SIGKILL"))
    return s, acts


def _spawn_failed(s: WatchState, ev: SpawnFailed, now: float) -> Result:
    s = stopping.launch_failed(s)
    if ev.called_off:  # the stop that called it off is the next event: it takes over
        return s, [Log("info", "child.launch_called_off", {"detail": ev.error})]
    acts: list[Action] = [Log("error", "child.spawn_failed", {"error": ev.error})]
    detail = f"could not start: {ev.error}"
    if ev.fatal:  # the config's fault, or the command that ran failing for a moment
        from vllmwatch.core import launchfail  # only then: the daemon's import count

        s, acts, detail, halted = launchfail.spawn_failed(s, ev, now)
        if halted:
            return s, acts
    if s.state not in CHILD_STATES:
        return s, acts
    s, more = _crashed(s, now, detail, "spawn failed")
    return s, acts + more


def _crashed(s: WatchState, now: float, detail: str, why: str,
             reason: Reason = Reason.CRASH) -> Result:
    """The child is gone unasked: a crash restart, and the sweep at once (nothing to stop)."""
    s, acts = ladder.begin_restart(s, now, reason, detail, drain=False)
    if s.state in CHILD_STATES and not on(s, Phase.RECORDING):  # else: swept after the record
        s, more = stopping.sweep(s, now, why)
        acts += more
    return s, acts


def _child_exited(s: WatchState, ev: ChildExited, now: float) -> Result:
    c = s.child
    if c is None or c.pid is None or ev.pid != c.pid:
        return s, [Log("debug", "child.exit_ignored", {"pid": ev.pid})]
    asked = s.state == S.STOPPING
    why = explain_exit(ev.code, ev.signal, asked, killed_by_us=asked and on(s, Phase.KILLING),
                       starting=s.state == S.STARTING, engines=ev.engines_gone,
                       told=ev.told_to_stop)
    acts: list[Action] = [Log("info" if asked else "warning", "child.exited", {
        "pid": ev.pid, "code": ev.code, "signal": ev.signal, "uptime_s": round(now - c.started, 2),
        "expected": asked, "detail": why, "last_lines": list(ev.last_lines[-5:])})]
    s = stopping.exited(s)
    # while recording, the record of the restart goes on; the take-down sweeps after it
    if s.state not in CHILD_STATES or on(s, Phase.RECORDING):
        return s, acts
    if asked or pending(s) is not None or s.exit_code is not None:
        s, more = stopping.sweep(s, now, "child exited")
        return s, acts + more
    if s.state == S.STARTING and ev.code == 2:  # the config's fault, or a passing one
        from vllmwatch.core import launchfail  # only then: the daemon's import count

        s, more, again = launchfail.exited_2(s, ev, now)  # again: a crash restart's detail
        s, crash = (s, []) if again is None else _crashed(s, now, again, "child exited")
        return s, acts + more + crash
    if s.state == S.STARTING and s.config.adapters:  # vLLM refused an adapter (issue 38)
        from vllmwatch.core import lora

        s, more = lora.start_refused(s, ev.last_lines)
        acts += more
    reason, detail = exit_cause(why, ev.code, asked, ev.engines_gone, s.state == S.STARTING,
                                ev.told_to_stop)
    acts += disk_full(s.config, ev.last_lines, ev.memory_lines, s.state == S.STARTING)
    mem = unified.start_failed(s, ev) if s.state == S.STARTING else None
    if mem is not None:  # vLLM said it ran out of memory: name it, stop if it repeats
        s, logs, detail, stop = mem
        acts += logs
        reason = unified.MEMORY_REASON
        if stop:
            s, more = ladder.halt(s, now, reason, detail)
            return s, acts + more
    s, more = _crashed(s, now, detail, "child exited", reason)
    return s, acts + more


def _prewarm_done(s: WatchState, ev: PrewarmDone, now: float) -> Result:
    if s.state != S.PREWARMING or not on(s, Phase.PREWARMING):  # (not the spare's build)
        return s, []
    if not ev.ok:  # nothing of vLLM runs yet: CLEANUP, then halt leaves at once
        s, acts = goto(s, S.CLEANUP, now, "a required pre-warm step failed")
        acts.append(Log("error", "prewarm.failed", {"detail": ev.detail}))
        s, more = ladder.halt(s, now, Reason.PREWARM_FAILED, ev.detail)
        return s, acts + more
    if ev.detail:
        s, acts = ladder.launch(s, now)
        return s, [Log("warning", "prewarm.failed", {"detail": ev.detail}), *acts]
    return ladder.launch(s, now)


def _due(s: WatchState, now: float) -> Result:
    acts: list[Action] = []
    if s.deadline is not None and now >= s.deadline:
        s, acts = _deadline(s, now)
    if s.state == S.CLEANUP and restart.due(s.restart.gate, now):
        s, more = ladder.check_release(s)
        acts += more
    c = s.child
    if c is not None and s.state in CHILD_STATES and not on(s, Phase.RECORDING):
        # While a restart's record is written nothing is judged (_result), so nothing is
        # fired either: a timer left in the past would spin the loop until the record lands.
        for kind, at in sorted(c.probes.timers.items(), key=lambda kv: kv[1]):
            if not PROBES[kind].timer_only and now >= at and s.state in CHILD_STATES:
                s, more = _fire(s, kind, now)
                acts += more
        s, more = probing.freshness(s, now)
        acts += more
    waiting = not s.ever_ready or s.exit_code is not None  # systemd waits on a start or stop
    if waiting and now >= s.next_extend and s.state not in FINAL:
        s = replace(s, next_extend=now + EXTEND_EVERY)
        if not restart.stuck(s, now):  # (stuck: systemd's start or stop timeout acts)
            acts.append(Notify(extend_usec=int(EXTEND_BY * 1e6)))
    return s, acts


def _deadline(s: WatchState, now: float) -> Result:
    if on(s, Phase.RECORDING) and s.state in CHILD_STATES:
        return ladder.incident_timed_out(s, now)
    if s.state == S.STARTING:
        held = _smoke_held(s)  # a failed required check (its answer), or one unanswered
        said = s.child.start.canary_said if s.child is not None and not held else ""
        return ladder.begin_restart(s, now, Reason.START_TIMEOUT, "not ready after "
                                    f"{s.config.startup.timeout:.0f}s (startup.timeout)"
                                    + (f": {held}" if held else "")
                                    + (f"; the last canary: {said}" if said else "")
                                    + hangs.got_to(s.child, now), drain=False)
    if s.state == S.DRAINING:
        s, acts = stopping.stop_child(s, now)
        c = s.child
        return s, [Log("warning", "drain.timeout", {
            "running": c.engine.running if c else None,
            "waiting": c.engine.waiting if c else None}), *acts]
    if s.state == S.STOPPING:
        return stopping.stopping_deadline(s, now)
    if s.state == S.BACKOFF:
        return ladder.spawn(replace(s, deadline=None), now)
    if s.state == S.CLEANUP and s.exit_code is not None:
        return stopping.finish(s, now, [Log("error", "daemon.sweep_timeout", {
            "detail": "leaving without confirmation that the old vLLM tree is gone"})])
    return replace(s, deadline=None), []


def _fire(s: WatchState, kind: K, now: float) -> Result:
    c = s.child
    assert c is not None
    st = c.start
    # A start at its smoke checks is not stalled: its canary answered, each check has its own
    # deadline and startup.timeout ends a held one, naming the check (_deadline), however
    # quiet vLLM is meanwhile (checks passing one after the other were a start_stall).
    stalled = now - st.last_progress >= s.config.startup.stall_timeout and c.smoke is None
    if kind == K.HEALTH and s.state == S.STARTING and stalled:
        return ladder.begin_restart(s, now, Reason.START_STALL, "no output and no progress for "
                                    f"{now - st.last_progress:.0f}s (startup.stall_timeout)"
                                    + hangs.stall_hint(st.cpu_since_progress, st.last_progress)
                                    + _health_said(st), drain=False)
    if kind == K.CANARY:
        return verdicts.fire(s, now)
    return probing.fire(s, kind, now)


def _health_said(st: Start) -> str:
    """What /health last answered once vLLM said it serves (a start refused, not stalled)."""
    if not st.health_said or not serving.ASK_HEALTH_AT & st.phases.keys():
        return ""
    return f"; vLLM said it serves, but /health answered: {st.health_said}"


def _smoke_held(s: WatchState) -> str:
    """Why the smoke checks hold READY ('' when they do not: core/smoke.unanswered)."""
    c = s.child
    if c is None or c.smoke is None:
        return ""
    from vllmwatch.core import smoke  # (loaded already: this start sent its checks)
    return smoke.unanswered(c.smoke)


def next_wakeup(s: WatchState) -> float | None:
    """The earliest time at which step() has something to do without a new event."""
    if s.state in FINAL:
        return None
    times: list[float] = []
    if s.state in CHILD_STATES and not on(s, Phase.RECORDING):  # no probes while recording
        due = probing.next_due(s)
        if due is not None:
            times.append(due)
    gate = s.restart.gate
    if s.state == S.CLEANUP and gate is not None and gate.look_at is not None:
        times.append(gate.look_at)
    if s.deadline is not None:
        times.append(s.deadline)
    if not s.ever_ready or s.exit_code is not None:
        times.append(s.next_extend)
    return min(times) if times else None


def watchdog_ok(s: WatchState, now: float | None = None) -> bool:
    """Whether vllmwatch may vouch for itself to systemd (WATCHDOG=1): not with a stale probe,
    nor with a rung waiting past its bound on a worker that never answered (restart.overdue)."""
    return not (now is not None and restart.stuck(s, now)) and (
        s.child is None or not s.child.probes.stale or s.state != S.READY)

