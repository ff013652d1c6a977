"""Pure: the restart ladder's decisions. Whether vLLM comes back (`begin_restart`) or
vllmwatch leaves (`halt`, the one way out) is decided here and only here; the take-down
itself (drain -> SIGTERM -> grace -> SIGKILL -> sweep) is core/stopping.py; after the sweep
come the GPU release gate, the first prewarm, backoff and the next launch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from vllmwatch.core import exitcodes, incidents, policy, reuse
from vllmwatch.core.actions import Action, CheckRelease, DoPrewarm, Log, Notify, Spawn, StopSending
from vllmwatch.core.events import Event, IncidentRecorded
from vllmwatch.core.names import FAILURE_REASONS, STUCK_REASONS, ProbeKind, Reason, exit_code
from vllmwatch.core.restart import Phase, ReleaseGate, on, pending
from vllmwatch.core.restart import begin as begin_rung
from vllmwatch.core.restart import goto as rung
from vllmwatch.core.state import (
    ChildRun,
    Probes,
    Result,
    S,
    Start,
    WatchState,
    goto,
    next_random,
)
from vllmwatch.core.stopping import finish, leave, stopping_deadline, take_down

RELEASE_POLL = 1.0  # the longest interval between two looks of the release gate
# The shortest: the driver frees a killed 130 GiB EngineCore's memory within a second of its
# death, and every look sooner is a second less of outage; the interval grows to
# RELEASE_POLL while the memory stays held (a look is one NVML query in a worker thread).
RELEASE_POLL_MIN = 0.05
FIRST_POLL = 1.0  # the first /health and memory look after a launch


def spawn(s: WatchState, now: float) -> Result:
    """Launch a new child generation: a fresh ChildRun replaces the last one whole."""
    why = pending(s) or "launch"
    s, acts = goto(s, S.STARTING, now, why, deadline=now + s.config.startup.timeout)
    s, more = rung(s, Phase.LAUNCHING, now, why)
    # Born whole: each sub-record's first values, from here on written by its owner only
    run = ChildRun(gen=s.gen + 1, started=now, vllm=s.config.vllm,
                   start=Start(last_progress=now, inputs=reuse.inputs(s.config)),
                   probes=Probes(timers={ProbeKind.HEALTH: now + FIRST_POLL,
                                         ProbeKind.MEMORY: now + FIRST_POLL}))
    s = replace(s, gen=run.gen, child=run)
    return s, [*acts, *more, Spawn(s.config)]


def launch(s: WatchState, now: float) -> Result:
    """The launch after the cleanup or the prewarm: on the first start with the spare on,
    the spare is built first (core/spare.py) and its answer launches the full engine."""
    if s.spare is not None:
        from vllmwatch.core import spare

        built = spare.build_first(s, now)
        if built is not None:
            return built
    return spawn(s, now)


def spare_event(s: WatchState, ev: Event, now: float) -> Result:
    """One of the spare's events (core/failover.SPARE_EVENTS): the spare moves, and the full
    engine launches when the first start's build is answered."""
    from vllmwatch.core import spare

    s, acts, go = spare.event(s, ev, now)
    if go or _build_given_up(s):
        return _first_launch(s, acts, now)
    return s, acts


def _build_given_up(s: WatchState) -> bool:
    """The first start waits on the spare's build (Phase.SPARE_BUILD) only while it is
    building: a build stopped, failed for good or turned off by a reload leaves the full
    engine to launch now (else the daemon would wait for an answer that never comes)."""
    if not on(s, Phase.SPARE_BUILD):
        return False
    from vllmwatch.core import spare  # on this rung the spare is on

    return not spare.building(s)


def _first_launch(s: WatchState, acts: list[Action], now: float) -> Result:
    if on(s, Phase.SPARE_BUILD) and s.exit_code is None:
        s, more = spawn(s, now)
        return s, acts + more
    return s, acts


def spare_ready(s: WatchState, now: float) -> Result:
    """The full engine is READY: the spare hands the traffic back and sleeps again."""
    if s.spare is None:
        return s, []
    from vllmwatch.core import spare

    return spare.full_ready(s, now)


def spare_reloaded(s: WatchState, now: float, changed: str = "",
                   inputs: tuple[tuple[str, str], ...] = (), relaunch: bool = True) -> Result:
    if s.spare is None:
        return s, []
    from vllmwatch.core import spare

    s, acts = spare.reloaded(s, now, changed, inputs, relaunch)
    return _first_launch(s, acts, now) if _build_given_up(s) else (s, acts)


def halt(s: WatchState, now: float, reason: Reason, detail: str,
         fields: Mapping[str, object] | None = None) -> Result:
    """The one way out (gunicorn's HaltServer): record the reason and its exit code (the
    reason table's, core/names.py), tell systemd (STOPPING=1), log `daemon.exiting` once, and
    take the child down; the ladder then ends in Exit(code). The first exit decided wins: a
    later call changes nothing."""
    if s.exit_code is not None:
        return s, []
    code = exit_code(reason)
    s = replace(s, exit_reason=reason, exit_detail=detail)
    acts: list[Action] = [Notify(stopping=True), Log(
        "info" if code == exitcodes.OK else "error", "daemon.exiting", {
            "code": code, "reason": str(reason), "detail": detail, "state": str(s.state),
            "meaning": exitcodes.MEANING.get(code, ""), **(fields or {})})]
    if s.spare is not None:
        from vllmwatch.core import spare  # only when the spare is on

        s, down = spare.halted(s, now)
        acts += down
    if reason in incidents.EXITS and s.state in incidents.STATES:
        # not a requested stop, and a child to read: the record first, then leave. Elsewhere
        # (a sweep under way, a backoff) leave() itself, which bounds a sweep that never
        # answers by SWEEP_WAIT.
        s, more = record_then_take_down(s, now, reason, detail, drain=False)
    else:
        s, more = leave(s, now)
    return s, acts + more


def begin_restart(s: WatchState, now: float, reason: Reason, detail: str, drain: bool
                  ) -> Result:
    """Record a restart and start taking the child down (once: a restart under way wins);
    the crash-loop guard turns a failure restart past restart.max_restarts into a halt."""
    if s.exit_code is not None or pending(s) is not None:
        return s, []
    failure = reason in FAILURE_REASONS
    ready_at = s.child.start.ready_at if s.child is not None else None
    stable = ready_at is not None and now - ready_at >= s.config.restart.stable_after
    if failure:
        times = (*policy.counted(s.restart_times, now, s.config.restart.window, s.ever_ready),
                 now)  # (before the first READY: every failed start, whatever the window)
        s = replace(s, restart_times=times, failures=1 if stable else s.failures + 1)
    elif stable:  # a planned restart ends a stable run too: the next failure is a first
        s = replace(s, failures=0)
    s = replace(begin_rung(s, reason, detail), last_reason=reason, last_detail=detail,
                last_restart_at=now)
    # A stuck engine finishes nothing: the gate ends its requests now, at the verdict, not
    # once the record is written and the engine killed (those not begun are replayed).
    cut: list[Action] = [StopSending()] if reason in STUCK_REASONS and s.pid is not None \
        else []
    if failure and policy.crash_loop(s.restart_times, s.config.restart):
        r, n = s.config.restart, len(s.restart_times)
        # the last failure begins no restart: `restarts` counts restart.begin, as everywhere
        log = Log("error", "crashloop.gave_up", {
            "reason": reason, "restarts": n - 1, "failures": n, "restarts_begun": n - 1,
            "window_s": r.window, "max_restarts": r.max_restarts,
            "hint": exitcodes.crashloop_hint(s.unit, s.config.incidents.enabled)})
        # The guard's numbers first (the record's and daemon.exiting's head), then the last
        # restart: "crash: exited with code 1" alone said nothing of the loop.
        s, acts = halt(s, now, Reason.CRASHLOOP, f"{policy.loop_said(r, n, s.ever_ready)}; "
                       f"the last: {reason}: {detail}")
        return s, [log, *cut, *acts]
    # after the guard (its give-up begins none): one per restart.begin, status and /metrics too
    counts = {**s.restarts_by_reason, reason: s.restarts_by_reason.get(reason, 0) + 1}
    s = replace(s, outage=policy.outage_counted(s.outage, reason, now), restarts_by_reason=counts)
    extra: dict[str, object] = {}
    wake: list[Action] = []
    if s.spare is not None:  # the spare wakes before the record and the take-down
        from vllmwatch.core import spare

        s, wake, extra["failover"] = spare.restart_begins(s, now, reason)
    log = Log("warning", "restart.begin", {
        "reason": reason, "detail": detail, "restarts": sum(counts.values()),
        "failures_in_row": s.failures, **extra})
    s, acts = record_then_take_down(s, now, reason, detail, drain)
    return s, [log, *cut, *wake, *acts]


def stop_requested(s: WatchState, signal: str, now: float) -> Result:
    """Honoured in every state; repeated or combined signals never lose it."""
    if s.exit_code is None:
        return halt(s, now, Reason.STOP, f"{signal} received", {"signal": signal})
    if s.state == S.STOPPING and s.child is not None and not on(s, Phase.KILLING):
        return stopping_deadline(s, now, hurry=True)  # a second signal: no more patience
    return leave(s, now, hurry=True)  # already leaving: make sure the way out is under way


def manual_restart(s: WatchState, now: float) -> Result:
    """SIGUSR1: a drained restart from READY or STARTING; in BACKOFF, launch now."""
    if s.state == S.BACKOFF and s.exit_code is None:
        return spawn(s, now)
    if s.exit_code is not None or s.state not in (S.READY, S.STARTING) or pending(s) is not None:
        why = ("vllmwatch is stopping" if s.exit_code is not None else "a restart is already "
               "under way" if pending(s) is not None else "vLLM's first start is under way")
        return s, [Log("info", "restart.ignored", {"state": str(s.state), "detail": why})]
    return begin_restart(s, now, Reason.MANUAL, "SIGUSR1", drain=True)


def record_then_take_down(s: WatchState, now: float, reason: Reason, detail: str, drain: bool
                          ) -> Result:
    """Unplanned: the incident record first (core/incidents.py), then the take-down; a
    requested restart, or no child to read, takes down at once."""
    if incidents.wanted(s, reason) and s.state in incidents.STATES:
        return incidents.request(s, now, reason, detail, drain)
    return take_down(s, now, drain)


def incident_recorded(s: WatchState, now: float, ev: IncidentRecorded) -> Result:
    """The record is written (or failed): the take-down goes on where it waited."""
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


def swept(s: WatchState, now: float, killed: tuple[int, ...], remaining: tuple[int, ...],
          port_holder: str | None, foreign: tuple[str, ...], error: str = "",
          killed_what: tuple[str, ...] = (), seen: tuple[int, ...] = ()) -> Result:
    """The sweep reported back; decide between fail, release gate, prewarm, backoff, launch."""
    acts: list[Action] = []
    if error:
        acts.append(Log("error", "leftovers.sweep_failed", {"error": error, "detail":
                        "could not verify that the old vLLM tree is gone"}))
    if killed:
        acts.append(Log("warning", "leftovers.killed", {
            "pids": list(killed), "processes": list(killed_what),
            "detail": "processes of an earlier child's tree were still running"}))
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
        s, more = halt(s, now, Reason.PORT_BUSY,
                       f"{port_holder} holds vllm.port {s.config.vllm.port}")
        return finish(s, now, acts + more)  # the sweep is back: nothing left to wait for
    # Every pid of the old tree the sweep killed or found (gone meanwhile: its memory may
    # still be held), beside those the sweep began with (core/stopping.sweep).
    s = replace(s, old_pids=tuple(sorted({*s.old_pids, *killed, *seen})))
    if s.old_pids and s.config.vllm.uses_gpu and s.config.restart.gpu_release_timeout > 0:
        gate = ReleaseGate(s.old_pids, now + s.config.restart.gpu_release_timeout, look_at=now,
                           opened=now)
        s, more = rung(replace(s, old_pids=()), Phase.RELEASE_WAIT, now,
                       "the old tree's GPU memory", gate=gate,
                       bound=s.config.restart.gpu_release_timeout)
        return s, acts + more
    s, more = after_cleanup(s, now)
    return s, acts + more


def release_checked(s: WatchState, now: float, released: bool, detail: str) -> Result:
    """The GPU release gate: wait until the old tree's GPU memory is back, bounded."""
    gate = s.restart.gate
    if released or gate is None:
        s, acts = after_cleanup(s, now)
        return s, [Log("info", "gpu.released", {"detail": detail}), *acts]
    if now >= gate.deadline:
        s, acts = after_cleanup(s, now)
        return s, [Log("warning", "gpu.release_timeout", {
            "detail": detail, "hint": "GPU memory of the old vLLM is still held; the next "
            "start may fail with out-of-memory"}), *acts]
    return _with_gate(s, replace(gate, look_at=now + release_poll(now - gate.opened))), []


def release_poll(waited: float) -> float:
    """Seconds to the gate's next look after `waited` seconds of held memory: half the wait,
    within [RELEASE_POLL_MIN, RELEASE_POLL]. With a fixed second, issue 33's H200 run lost
    most of one: after an API server SIGKILL the first look (0.39 s after restart.begin, right
    after the sweep killed the engine) found its memory still held, the next one (1.40 s)
    found it back, and the relaunch began there."""
    return min(RELEASE_POLL, max(RELEASE_POLL_MIN, waited / 2))


def check_release(s: WatchState) -> Result:
    """Ask the shell to look at the GPUs (one look in flight at a time)."""
    gate = s.restart.gate
    assert gate is not None, "no release gate to look for"
    s = _with_gate(s, replace(gate, look_at=None))
    before = s.child.proc.gpu_before_mib if s.child is not None else ()  # the old child's launch
    return s, [CheckRelease(gate.old_pids, s.config.restart.gpu_release_tolerance, before)]


def _with_gate(s: WatchState, gate: ReleaseGate) -> WatchState:
    return replace(s, restart=replace(s.restart, gate=gate))


def after_cleanup(s: WatchState, now: float) -> Result:
    """Everything of the old child is gone: prewarm once, wait out the backoff, launch."""
    if s.exit_code is not None:
        return finish(s, now, [])
    if s.spare is not None:  # a wake that found no room beside the old tree goes now
        from vllmwatch.core import spare

        s, woke = spare.released(s, now)
        s, acts = _after_cleanup(s, now)
        return s, woke + acts
    return _after_cleanup(s, now)


def _after_cleanup(s: WatchState, now: float) -> Result:
    if not s.prewarmed and s.config.prewarm.enabled:
        s, acts = goto(s, S.PREWARMING, now, "first start")
        s, more = rung(s, Phase.PREWARMING, now, "first start", bound=s.config.prewarm.timeout)
        return replace(s, prewarmed=True), [*acts, *more, DoPrewarm(s.config)]
    why = pending(s)
    planned = why is not None and why not in FAILURE_REASONS
    s, rand = next_random(s)
    # The first failure in a row relaunches at once: after a stable run one crash says
    # nothing about the next start, and every second of backoff is an outage (issue 28).
    # The crash-loop backoff starts at the second failure in a row.
    delay = 0.0 if planned else policy.backoff_delay(s.config.restart, s.failures - 1, rand)
    if delay <= 0:
        return launch(replace(s, prewarmed=True), now)
    s, acts = goto(s, S.BACKOFF, now, f"wait {delay:.1f}s before restart", deadline=now + delay)
    s, more = rung(s, Phase.BACKOFF, now, f"wait {delay:.1f}s before restart")
    acts += more
    acts.append(Log("info", "restart.backoff", {"delay_s": round(delay, 2),
                                                 "failures_in_row": s.failures}))
    return s, acts


