"""Pure: step(state, event, now) -> (state, actions). The supervisor's whole brain."""

from __future__ import annotations

from vllmwatch.config.schema import Config
from vllmwatch.core import ladder, serving
from vllmwatch.core.events import (
    Action,
    CanaryResult,
    ChildExited,
    ChildOutput,
    Event,
    HealthResult,
    Log,
    MemorySampled,
    MetricsResult,
    Notify,
    PrewarmDone,
    ReleaseChecked,
    ReloadRequested,
    RestartRequested,
    SampleMemory,
    Spawned,
    SpawnFailed,
    StopRequested,
    SweepDone,
    Tick,
)
from vllmwatch.core.ladder import Result
from vllmwatch.core.policy import explain_exit
from vllmwatch.core.state import FINAL, S, WatchState, goto

EXTEND_EVERY = 10.0  # how often EXTEND_TIMEOUT_USEC is sent while systemd waits for us
EXTEND_BY = 60.0


def initial(config: Config, now: float) -> WatchState:
    """The state before anything ran."""
    return WatchState(config=config, since=now)


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
            s, acts = ladder.sweep(s, now, "look for leftovers before the first start")
            return s, [Log("info", "daemon.start", {"config": s.config.path}), *acts]
        return s, []
    if isinstance(ev, (HealthResult, CanaryResult, MetricsResult, MemorySampled)):
        return _result(s, ev, now)
    if isinstance(ev, ChildOutput):
        return serving.child_output(s, ev, now)
    if isinstance(ev, Spawned):
        return s.with_(pid=ev.pid, pgid=ev.pid), [Log("info", "child.started", {
            "pid": ev.pid, "gen": s.gen, "command": ev.argv_display})]
    if isinstance(ev, SpawnFailed):
        return _spawn_failed(s, ev, now)
    if isinstance(ev, ChildExited):
        return _child_exited(s, ev, now)
    if isinstance(ev, SweepDone):
        if s.state != S.CLEANUP:
            return s, []
        return ladder.swept(s, now, ev.killed, ev.remaining, ev.port_holder, ev.foreign_vllm)
    if isinstance(ev, ReleaseChecked):
        if s.state != S.CLEANUP or not s.old_pids:
            return s, []
        return ladder.release_checked(s, now, ev.released, ev.detail)
    if isinstance(ev, PrewarmDone):
        return _prewarm_done(s, ev, now)
    if isinstance(ev, StopRequested):
        return _stop_requested(s, ev, now)
    if isinstance(ev, RestartRequested):
        return _manual_restart(s, now)
    return _reload(s, ev, now)


def _result(s: WatchState, ev: Event, now: float) -> Result:
    kind = ("memory" if isinstance(ev, MemorySampled) else "metrics"
            if isinstance(ev, MetricsResult) else "health" if isinstance(ev, HealthResult)
            else "warmup" if isinstance(ev, CanaryResult) and ev.warmup else "canary")
    s = s.with_(inflight=s.inflight - {kind})
    if getattr(ev, "gen", s.gen) != s.gen:
        return s, []
    if isinstance(ev, HealthResult):
        return serving.health(s, ev, now)
    if isinstance(ev, CanaryResult):
        return serving.canary(s, ev, now)
    if isinstance(ev, MetricsResult):
        return serving.metrics(s, ev, now)
    assert isinstance(ev, MemorySampled)
    return serving.memory(s, ev, now)


def _spawn_failed(s: WatchState, ev: SpawnFailed, now: float) -> Result:
    acts: list[Action] = [Log("error", "child.spawn_failed", {"error": ev.error})]
    if ev.fatal:
        s = s.with_(exit_code=ladder.EXIT_CONFIG)
    s, more = ladder.begin_restart(s, now, "crash", f"could not start: {ev.error}", drain=False)
    if s.state != S.CLEANUP:
        s, sweep = ladder.sweep(s, now, "spawn failed")
        more += sweep
    return s, acts + more


def _child_exited(s: WatchState, ev: ChildExited, now: float) -> Result:
    asked = s.state == S.STOPPING
    uptime = round(now - s.child_started, 2) if s.child_started is not None else None
    why = explain_exit(ev.code, ev.signal, asked, killed_by_us=asked and s.killed)
    acts: list[Action] = [Log("info" if asked else "warning", "child.exited", {
        "pid": ev.pid, "code": ev.code, "signal": ev.signal, "uptime_s": uptime,
        "expected": asked, "detail": why, "last_lines": list(ev.last_lines[-5:])})]
    s = s.with_(pid=None)
    if asked or s.pending is not None or s.exit_code is not None:
        s, more = ladder.sweep(s, now, "child exited")
        return s, acts + more
    if s.state == S.STARTING and ev.code == 2:
        hint = next((ln for ln in reversed(ev.last_lines) if "error" in ln.lower()), why)
        acts.append(Log("error", "child.rejected_arguments", {
            "error": hint, "hint": "vLLM refused its command line; fix [vllm] in the config "
            "(see `vllmwatch print-command` and `vllmwatch check`)"}))
        s = s.with_(exit_code=ladder.EXIT_CONFIG)
    detail = ("during start: " if s.state == S.STARTING else "") + why
    s, more = ladder.begin_restart(s, now, "crash", detail, drain=False)
    if s.state != S.CLEANUP:
        s, sweep = ladder.sweep(s, now, "child exited")
        more += sweep
    return s, acts + more


def _prewarm_done(s: WatchState, ev: PrewarmDone, now: float) -> Result:
    if s.state != S.PREWARMING:
        return s, []
    if not ev.ok:
        s, acts = goto(s.with_(exit_code=ladder.EXIT_FAILURE), S.CLEANUP, now,
                       "a required pre-warm step failed")
        acts.append(Log("error", "prewarm.failed", {"detail": ev.detail}))
        return ladder.finish(s, now, acts)
    if s.exit_code is not None:
        s, acts = goto(s, S.CLEANUP, now, "stop requested")
        return ladder.finish(s, now, acts)
    return ladder.spawn(s, now)


def _stop_requested(s: WatchState, ev: StopRequested, now: float) -> Result:
    if s.exit_code is not None:
        if s.state == S.STOPPING and not s.killed:  # a second signal: no more patience
            return ladder.stopping_deadline(s, now)
        return s, []
    s = s.with_(exit_code=0)
    acts: list[Action] = [Notify(stopping=True), Log("info", "daemon.stopping", {
        "signal": ev.signal, "state": str(s.state)})]
    if s.state in (S.STARTING, S.READY, S.DRAINING) and s.pid is not None:
        s, more = ladder.stop_child(s, now)
    elif s.state in (S.BACKOFF, S.PREWARMING):
        s, more = ladder.sweep(s, now, "stop requested")
    else:  # STOPPING and CLEANUP finish on their own and then see exit_code
        more = []
    return s, acts + more


def _manual_restart(s: WatchState, now: float) -> Result:
    if s.state == S.BACKOFF:
        return ladder.spawn(s, now)
    if s.state not in (S.READY, S.STARTING):
        return s, [Log("info", "restart.ignored", {"state": str(s.state),
                                                    "detail": "a restart is already under way"})]
    return ladder.begin_restart(s, now, "manual", "SIGUSR1", drain=True)


def _reload(s: WatchState, ev: ReloadRequested, now: float) -> Result:
    acts: list[Action] = [Notify(reloading=True)]
    if ev.config is None:
        acts += [Log("error", "config.reload_failed", {
            "error": ev.error, "detail": "keeping the running config"}), Notify(ready=True)]
        return s, acts
    old = s.config
    relaunch = old.vllm != ev.config.vllm or old.prewarm.cache_dir != ev.config.prewarm.cache_dir
    s = s.with_(config=ev.config)
    acts.append(Log("info", "config.reloaded", {"path": ev.config.path,
                                                "sha256": ev.config.sha256[:12],
                                                "restart_needed": relaunch}))
    acts.append(Notify(ready=True))
    if relaunch and s.state in (S.READY, S.STARTING):
        s, more = ladder.begin_restart(s, now, "reload", "the vLLM command or environment "
                                       "changed", drain=True)
        acts += more
    return s, acts


def _due(s: WatchState, now: float) -> Result:
    acts: list[Action] = []
    if s.deadline is not None and now >= s.deadline:
        s, acts = _deadline(s, now)
    for kind, at in sorted(s.timers.items(), key=lambda kv: kv[1]):
        if now >= at and s.state not in FINAL:
            s, more = _fire(s, kind, now)
            acts += more
    waiting = not s.ever_ready or s.exit_code is not None  # systemd waits on a start or stop
    if waiting and now >= s.next_extend and s.state not in FINAL:
        s = s.with_(next_extend=now + EXTEND_EVERY)
        acts.append(Notify(extend_usec=int(EXTEND_BY * 1e6)))
    return s, acts


def _deadline(s: WatchState, now: float) -> Result:
    if s.state == S.STARTING:
        return ladder.begin_restart(s, now, "start_timeout", "not ready after "
                                    f"{s.config.startup.timeout:.0f}s (startup.timeout)",
                                    drain=False)
    if s.state == S.DRAINING:
        s, acts = ladder.stop_child(s, now)
        return s, [Log("warning", "drain.timeout", {"running": s.running,
                                                     "waiting": s.waiting}), *acts]
    if s.state == S.STOPPING:
        return ladder.stopping_deadline(s, now)
    if s.state == S.BACKOFF:
        return ladder.spawn(s.with_(deadline=None), now)
    return s.with_(deadline=None), []


def _fire(s: WatchState, kind: str, now: float) -> Result:
    p = s.config.probe
    if kind == "release":
        return s.with_(timers={}), ladder.check_release(s)
    if kind == "health":
        if s.state == S.STARTING and now - s.last_progress >= s.config.startup.stall_timeout:
            return ladder.begin_restart(s, now, "start_stall", "no output and no progress for "
                                        f"{now - s.last_progress:.0f}s (startup.stall_timeout)",
                                        drain=False)
        wait = p.interval if s.state == S.READY else serving.STARTUP_POLL
        return ladder.probe(s.with_(timers={**s.timers, "health": now + wait}), "health", now)
    if kind == "canary":
        s = s.with_(timers={**s.timers, "canary": now + p.canary_interval})
        if s.state != S.READY:
            return s, []
        if "canary" not in s.inflight:  # busy-or-hung compares against this point
            s = s.with_(canary_ref=s.progress)
        return ladder.probe(s, "canary", now)
    if kind == "metrics":
        wait = serving.DRAIN_POLL if s.state == S.DRAINING else p.metrics_interval
        return ladder.probe(s.with_(timers={**s.timers, "metrics": now + wait}), "metrics", now)
    if kind == "memory":
        return _sample_memory(s, now)
    return s, []


def _sample_memory(s: WatchState, now: float) -> Result:
    m = s.config.memory
    timers = {**s.timers, "memory": now + m.sample_interval}
    pss_due = now >= s.timers.get("pss", 0.0)
    if pss_due:
        timers["pss"] = now + m.pss_interval
    s = s.with_(timers=timers)
    if "memory" in s.inflight or s.pid is None:
        return s, []
    return s.with_(inflight=s.inflight | {"memory"}), [SampleMemory(pss_due, s.gen)]


def next_wakeup(s: WatchState) -> float | None:
    """The earliest time at which step() has something to do without a new event."""
    if s.state in FINAL:
        return None
    times = [t for k, t in s.timers.items() if k != "pss"]
    if s.deadline is not None:
        times.append(s.deadline)
    if not s.ever_ready or s.exit_code is not None:
        times.append(s.next_extend)
    return min(times) if times else None
