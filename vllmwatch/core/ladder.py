"""Pure: the restart ladder. Drain -> SIGTERM -> grace -> SIGKILL -> sweep -> release -> backoff."""

from __future__ import annotations

from vllmwatch.core import drain as drains
from vllmwatch.core import exitcodes, incidents, policy, probing
from vllmwatch.core.events import (
    Action,
    CheckRelease,
    DoPrewarm,
    Exit,
    IncidentRecorded,
    Log,
    Notify,
    SignalGroup,
    Spawn,
    Sweep,
)
from vllmwatch.core.state import (
    CHILD_STATES,
    FAILURE_REASONS,
    ChildRun,
    Result,
    S,
    WatchState,
    goto,
    next_random,
)

KILL_WAIT = 10.0  # after SIGKILL, how long to wait for the exit before sweeping anyway
SWEEP_WAIT = 20.0  # on the way out, how long a sweep may take before we leave regardless
RELEASE_POLL = 1.0
SETTLE = 3.0  # after a requested stop, how long the engine may take to follow the API server
STUCK_REASONS = frozenset({"hang", "stall"})
STUCK_GRACE = 5.0  # SIGTERM -> SIGKILL for an engine known to be stuck
FIRST_POLL = 1.0  # the first /health and memory look after a launch


def spawn(s: WatchState, now: float) -> Result:
    """Launch a new child generation: a fresh ChildRun replaces the last one whole."""
    s, acts = goto(s, S.STARTING, now, s.pending[0] if s.pending else "launch",
                   deadline=now + s.config.startup.timeout)
    run = ChildRun(gen=s.gen + 1, started=now, vllm=s.config.vllm, last_progress=now,
                   timers={"health": now + FIRST_POLL, "memory": now + FIRST_POLL})
    s = s.with_(gen=run.gen, child=run, pending=None, release_at=None, release_deadline=None)
    return s, [*acts, Spawn(s.config)]


def begin_restart(s: WatchState, now: float, reason: str, detail: str, drain: bool) -> Result:
    """Record a restart and start taking the child down (once: a restart under way wins)."""
    if s.exit_code is not None or s.pending is not None:
        return s, []
    acts: list[Action] = []
    failure = reason in FAILURE_REASONS
    if failure:
        ready_at = s.child.ready_at if s.child is not None else None
        stable = ready_at is not None and now - ready_at >= s.config.restart.stable_after
        times = (*policy.prune_window(s.restart_times, now, s.config.restart.window), now)
        s = s.with_(restart_times=times, failures=1 if stable else s.failures + 1)
    counts = dict(s.restarts_by_reason)
    counts[reason] = counts.get(reason, 0) + 1
    s = s.with_(pending=(reason, detail), restarts_by_reason=counts, last_reason=reason,
                last_detail=detail, last_restart_at=now, recovering=True)
    if failure and policy.crash_loop(s.restart_times, s.config.restart):
        r = s.config.restart
        acts.append(Log("error", "crashloop.gave_up", {
            "reason": reason, "restarts": len(s.restart_times), "window_s": r.window,
            "max_restarts": r.max_restarts,
            "hint": "vLLM keeps failing; read its last lines above, fix the cause, then "
                    "`systemctl restart vllmwatch`"}))
        s = s.with_(exit_code=exitcodes.GAVE_UP)
        drain = False
    else:
        acts.append(Log("warning", "restart.begin", {
            "reason": reason, "detail": detail, "restarts": sum(counts.values()),
            "failures_in_row": s.failures}))
    s, more = record_then_take_down(s, now, reason, detail, drain)
    return s, acts + more


def record_then_take_down(s: WatchState, now: float, reason: str, detail: str, drain: bool
                          ) -> Result:
    """Unplanned: write the incident record first (core/incidents.py); else take down now."""
    if incidents.wanted(s, reason) and s.state in CHILD_STATES:
        return incidents.request(s, now, reason, detail, drain)
    return take_down(s, now, drain)


def incident_recorded(s: WatchState, now: float, ev: IncidentRecorded) -> Result:
    """The record is written (or failed): the restart goes on where it waited."""
    s, acts, wait = incidents.recorded(s, ev.seq, ev.incident_id, ev.path, ev.error,
                                       ev.seconds, ev.stacks)
    if wait is None:
        return s, acts
    s, more = take_down(s, now, wait.drain)
    return s, acts + more


def incident_timed_out(s: WatchState, now: float) -> Result:
    """The record did not come back by the core's deadline: go on without it."""
    s, acts, wait = incidents.timed_out(s, now)
    s, more = take_down(s, now, wait.drain)
    return s, acts + more


def _has_child(s: WatchState) -> bool:
    """A child is running, or its launch is out and not yet answered."""
    c = s.child
    return s.state in CHILD_STATES and c is not None and (c.pid is not None or not c.spawned)


def take_down(s: WatchState, now: float, drain: bool) -> Result:
    """Drain if asked and possible, else stop the child; with no child, sweep at once."""
    if s.incident_wait is not None:  # a stop overtakes a record under way: its answer is moot
        s = s.with_(incident_wait=None, deadline=None)
    if s.state == S.STOPPING:
        return s, []
    if _has_child(s):
        dereg, timeout = drains.plan(drain, s.state == S.READY,
                                     s.config.drain.deregister_delay,
                                     s.config.restart.drain_timeout)
        if dereg + timeout > 0:
            return begin_drain(s, now, dereg, timeout)
        return stop_child(s, now)
    if s.state == S.CLEANUP:
        return s, []  # the sweep under way ends in after_cleanup, which sees the new plan
    return sweep(s, now, "no child to stop")


def begin_drain(s: WatchState, now: float, dereg: float, timeout: float) -> Result:
    """/readyz turns 503 now; stop once deregistered and idle (core/drain.py)."""
    d = drains.begin(now, dereg, timeout)
    s, acts = goto(s, S.DRAINING, now, "drain before restart", deadline=drains.deadline(d))
    assert s.child is not None
    s = s.with_child(drain=d, timers={**s.child.timers,
                                      "metrics": drains.next_check(d, now, probing.DRAIN_POLL)})
    acts.append(Log("info", "drain.begin", {"phase": str(drains.phase(d, now)),
                                            "deregister_delay_s": dereg,
                                            "drain_timeout_s": timeout}))
    return s, acts


def stop_child(s: WatchState, now: float) -> Result:
    """SIGTERM the group and give it restart.stop_timeout (less when the engine is stuck
    or gone)."""
    if s.child is not None and s.child.drain is not None:
        s = s.with_child(drain=drains.stopping(s.child.drain, now))
    grace = s.config.restart.stop_timeout
    stuck = s.pending is not None and s.pending[0] in STUCK_REASONS
    if stuck or (s.child is not None and s.child.engine_gone):
        # Measured: the API server of a hung engine waits on it and ignores SIGTERM, and with
        # --api-server-count 2 vLLM's launcher outlived a dead EngineCore's SIGTERM for the
        # whole 20 s (2 x H200). The full grace would only add downtime; nothing in flight
        # can finish anyway.
        grace = min(grace, STUCK_GRACE)
    s, acts = goto(s, S.STOPPING, now, "stop child", deadline=now + grace)
    acts.append(SignalGroup("SIGTERM"))
    acts.append(Log("info", "child.stopping", {"pid": s.pid, "signal": "SIGTERM",
                                               "grace_s": grace}))
    if s.exit_code is not None:
        acts.append(Notify(extend_usec=int((grace + KILL_WAIT + SWEEP_WAIT) * 1e6)))
    return s, acts


def stopping_deadline(s: WatchState, now: float) -> Result:
    """The grace period ran out: SIGKILL; after that, sweep whatever is left."""
    if s.child is not None and not s.child.killed:
        acts: list[Action] = [SignalGroup("SIGKILL"), Log("warning", "child.kill", {
            "pid": s.pid, "after_s": round(now - s.since, 1),
            "detail": "did not exit after SIGTERM; sent SIGKILL to its process group"})]
        return s.with_child(killed=True).with_(deadline=now + KILL_WAIT), acts
    s2, acts = sweep(s, now, "child did not exit after SIGKILL")
    acts.insert(0, Log("error", "child.unkillable", {"pid": s.pid, "hint": "the process may "
                       "be stuck in the kernel (D state); check `ps -o stat,wchan -p PID`"}))
    return s2, acts


def sweep(s: WatchState, now: float, reason: str) -> Result:
    """Kill what is left of the old tree, and look at the port."""
    c = s.child
    old_pgid = c.pgid if c is not None else None
    settle = SETTLE if s.state == S.STOPPING else 0.0
    # The tree's pids from the last sample: the GPU release gate waits until NVML drops them.
    old = c.memory.tree_pids if c is not None and c.memory is not None else ()
    deadline = now + SWEEP_WAIT if s.exit_code is not None else None
    s, acts = goto(s.with_(incident_wait=None), S.CLEANUP, now, reason, deadline=deadline)
    if c is not None and c.drain is not None:  # the drain ends with the child
        phases = drains.durations(drains.exited(c.drain, now), now)
        s = s.with_(last_drain=phases).with_child(drain=None)
        acts.append(Log("info", "drain.finished", {"phases_s": phases}))
    if c is not None:
        s = s.with_child(pid=None, pgid=None, inflight=frozenset(), timers={}, memory=None)
    s = s.with_(old_pids=tuple(old), sweeping=True, release_at=None, release_deadline=None)
    v = c.vllm if c is not None else s.config.vllm
    acts.append(Sweep(old_pgid, v.host, v.port, s.config.restart.kill_stale, settle))
    return s, acts


def swept(s: WatchState, now: float, killed: tuple[int, ...], remaining: tuple[int, ...],
          port_holder: str | None, foreign: tuple[str, ...], error: str = "") -> Result:
    """The sweep reported back; decide between fail, release gate, prewarm, backoff, launch."""
    s = s.with_(sweeping=False)
    acts: list[Action] = []
    if error:
        acts.append(Log("error", "leftovers.sweep_failed", {"error": error, "detail":
                        "could not verify that the old vLLM tree is gone"}))
    if killed:
        acts.append(Log("warning", "leftovers.killed", {"pids": list(killed),
                        "detail": "vLLM processes of an earlier child were still running"}))
    if remaining:
        acts.append(Log("error", "leftovers.remaining", {"pids": list(remaining)}))
    if foreign:
        acts.append(Log("warning", "leftovers.foreign", {"processes": list(foreign),
                        "detail": "vLLM processes not started by this vllmwatch; not touched"}))
    if s.exit_code is not None:
        return finish(s, now, acts)
    if port_holder:
        acts.append(Log("error", "port.busy", {
            "port": s.config.vllm.port, "holder": port_holder,
            "hint": "another process holds vllm.port; stop it or choose another port"}))
        return finish(s.with_(exit_code=exitcodes.START), now, acts)
    if killed:
        s = s.with_(old_pids=tuple(sorted({*s.old_pids, *killed})))
    if s.old_pids and s.config.vllm.uses_gpu and s.config.restart.gpu_release_timeout > 0:
        s = s.with_(release_deadline=now + s.config.restart.gpu_release_timeout, release_at=now)
        return s, acts
    s, more = after_cleanup(s, now)
    return s, acts + more


def release_checked(s: WatchState, now: float, released: bool, detail: str) -> Result:
    """The GPU release gate: wait until the old tree's GPU memory is back, bounded."""
    if released:
        s = s.with_(old_pids=(), release_deadline=None, release_at=None)
        s, acts = after_cleanup(s, now)
        return s, [Log("info", "gpu.released", {"detail": detail}), *acts]
    if s.release_deadline is not None and now >= s.release_deadline:
        s = s.with_(old_pids=(), release_deadline=None, release_at=None)
        s, acts = after_cleanup(s, now)
        return s, [Log("warning", "gpu.release_timeout", {
            "detail": detail, "hint": "GPU memory of the old vLLM is still held; the next "
            "start may fail with out-of-memory"}), *acts]
    return s.with_(release_at=now + RELEASE_POLL), []


def check_release(s: WatchState) -> Result:
    """Ask the shell to look at the GPUs (one look in flight at a time)."""
    s = s.with_(release_at=None)
    return s, [CheckRelease(s.old_pids, s.config.restart.gpu_release_tolerance)]


def after_cleanup(s: WatchState, now: float) -> Result:
    """Everything of the old child is gone: prewarm once, wait out the backoff, launch."""
    if s.exit_code is not None:
        return finish(s, now, [])
    if not s.prewarmed and s.config.prewarm.enabled:
        s, acts = goto(s, S.PREWARMING, now, "first start")
        return s.with_(prewarmed=True), [*acts, DoPrewarm(s.config)]
    planned = s.pending is not None and s.pending[0] not in FAILURE_REASONS
    s, rand = next_random(s)
    delay = 0.0 if planned else policy.backoff_delay(s.config.restart, s.failures, rand)
    if delay <= 0:
        return spawn(s.with_(prewarmed=True), now)
    s, acts = goto(s, S.BACKOFF, now, f"wait {delay:.1f}s before restart", deadline=now + delay)
    acts.append(Log("info", "restart.backoff", {"delay_s": round(delay, 2),
                                                 "failures_in_row": s.failures}))
    return s.with_(backoff_until=now + delay), acts


def finish(s: WatchState, now: float, acts: list[Action]) -> Result:
    """Leave for good with s.exit_code."""
    code = s.exit_code if s.exit_code is not None else 0
    to = S.STOPPED if code == 0 else S.FAILED
    s, more = goto(s, to, now, "exit" if code == 0 else f"exit code {code}")
    acts += more
    acts.append(Log("info" if code == 0 else "error", "daemon.exit", {
        "code": code, "meaning": exitcodes.MEANING.get(code, "")}))
    acts.append(Exit(code))
    return s, acts
