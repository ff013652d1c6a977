"""Pure: readiness while starting, and the probe verdicts while serving.

This module owns the child's `Start`, `Engine` and `Memory` records (core/state.py).
"""

from __future__ import annotations

from dataclasses import replace

from vllmwatch.core import gpufault, hangs, leak, policy, probing, reuse
from vllmwatch.core import hangverdicts as verdicts
from vllmwatch.core.actions import Action, Log, Notify
from vllmwatch.core.events import (
    CanaryResult,
    ChildOutput,
    HealthResult,
    MemorySampled,
    MetricsResult,
)
from vllmwatch.core.ladder import begin_restart, spare_ready
from vllmwatch.core.names import ProbeKind as K
from vllmwatch.core.names import Reason
from vllmwatch.core.restart import Phase, pending
from vllmwatch.core.restart import goto as rung
from vllmwatch.core.samples import gpu_figure, gpu_kind, host_figure
from vllmwatch.core.state import ChildRun, Engine, Memory, Result, S, Start, WatchState, goto
from vllmwatch.core.stopping import drain_look

MEM_RECENT = 32  # memory samples kept for an incident record (core/incidents.py)
# Start phases (shell/childlog.py) after which the API server listens: /health is asked at
# once instead of at the next STARTUP_POLL, ~0.5 s sooner READY on average (issue 28).
ASK_HEALTH_AT = frozenset({"api_ready"})


def _run(s: WatchState) -> ChildRun:
    assert s.child is not None, "a result without a child run"
    return s.child


# The records this module owns, put back into the current child
def _start(s: WatchState, start: Start) -> WatchState:
    return replace(s, child=replace(s.run, start=start))


def _engine(s: WatchState, engine: Engine) -> WatchState:
    return replace(s, child=replace(s.run, engine=engine))


def _mem(s: WatchState, mem: Memory) -> WatchState:
    return replace(s, child=replace(s.run, mem=mem))


def child_output(s: WatchState, ev: ChildOutput, now: float) -> Result:
    """Any line is progress while starting; milestones are start phases with durations."""
    if s.state == S.READY and s.child is not None:
        return _told(s, ev, now) if ev.told_to_stop else _late_milestone(s, ev, now)
    if s.state != S.STARTING or s.child is None:
        return s, []
    c, st = s.child, s.child.start
    s = _start(s, replace(st, last_progress=now,
                          compile_cache_hit=st.compile_cache_hit or ev.compile_cache_hit,
                          reuse=reuse.merge(st.reuse, ev.reuse) if ev.reuse else st.reuse))
    if ev.milestone is None or ev.milestone in st.phases:
        return s, []
    since_start = now - c.started
    prev = st.last_milestone_at if st.last_milestone_at is not None else c.started
    phases = {**st.phases, ev.milestone: round(since_start, 3)}
    log = Log("info", "startup.phase", {"phase": ev.milestone, "at_s": round(since_start, 2),
                                        "took_s": round(now - prev, 2)})
    s = _start(s, replace(s.run.start, phases=phases, last_milestone_at=now))
    if ev.milestone in ASK_HEALTH_AT:  # it says it serves: ask now, not at the next poll
        s = probing.set_timer(s, K.HEALTH, now)
    return s, [log]


def _told(s: WatchState, ev: ChildOutput, now: float) -> Result:
    """vLLM said a SIGTERM or SIGINT started its shutdown while it served, and vllmwatch sent
    none (while it stops its child the state is not READY): the server goes away now, and
    the /health refusals before its exit read as `health` (--api-server-count 2: its launcher
    waits up to vLLM's shutdown timeout). The restart begins at once, as its exit would say."""
    if ev.pid != _run(s).pid:
        return s, []  # (a line of an older child's, read late)
    return begin_restart(s, now, Reason.CRASH, policy.outside_stop(ev.told_to_stop) + "; "
                         "restarted without waiting for its exit (`vllmwatch check` lists "
                         "other supervisors)", drain=False)


def _late_milestone(s: WatchState, ev: ChildOutput, now: float) -> Result:
    """A milestone read after READY is logged, marked late: written before the API answered,
    its line can reach us after the probes on a busy box; a missing phase reads as skipped."""
    st = s.run.start
    if ev.milestone is None or ev.milestone in st.phases:
        return s, []
    at = round(now - s.run.started, 3)
    s = _start(s, replace(st, phases={**st.phases, ev.milestone: at}))
    return s, [Log("info", "startup.phase", {"phase": ev.milestone, "at_s": round(at, 2),
                                             "late": True})]


def health(s: WatchState, ev: HealthResult, now: float) -> Result:
    """A /health answer: readiness step while starting, failure counting while serving."""
    s = replace(s, probe_seconds={**s.probe_seconds, K.HEALTH: ev.seconds})
    if s.state == S.STARTING:
        s = probing.set_timer(s, K.HEALTH, now + probing.STARTUP_POLL)
        s = _start(s, replace(s.run.start, health_said="" if ev.ok else  # for a stall's detail
                              ev.error or f"HTTP {ev.status}"))
        if ev.ok and s.run.smoke is None:  # the canary passed once smoke checks began
            return probing.start(s, K.CANARY, now)
        # Refused: not listening yet. Listening but no whole answer within probe.timeout (a
        # trickle): counted like a failed probe while serving, never waited out silently
        # until startup.timeout.
        return _probe_failed(s, now, K.HEALTH, ev.error or "timed out") if ev.timed_out \
            else (s, [])
    if s.state != S.READY:
        return s, []
    if ev.ok:
        return _engine(s, replace(s.run.engine, health_failures=0)), []
    if ev.engine_gone:
        # Measured: EngineCore dead -> /health 503 within 0.2 s and the API server exits 0
        # seconds later; a dead TP worker -> 503 only ~4 s later. With an engine process gone
        # nothing can recover: do not wait for failure_threshold probes.
        # The shell's error names the dead process and how it died (shell/engines.py).
        return begin_restart(_engine(s, replace(s.run.engine, engine_gone=True)), now,
                             Reason.ENGINE_DIED, ev.error or "an engine process died",
                             drain=False)
    return _probe_failed(s, now, K.HEALTH, ev.error or f"HTTP {ev.status}")


def _probe_failed(s: WatchState, now: float, kind: K, error: str) -> Result:
    # One counter per probe: a canary that still succeeds must not hide a /health that
    # keeps failing (and the other way round), so neither resets the other's streak.
    e = _run(s).engine
    n = (e.health_failures if kind == K.HEALTH else e.canary_failures) + 1
    s = replace(s, probe_failures={**s.probe_failures, kind: s.probe_failures.get(kind, 0) + 1})
    s = _engine(s, replace(e, health_failures=n) if kind == K.HEALTH
                else replace(e, canary_failures=n))
    threshold = s.config.probe.failure_threshold
    acts: list[Action] = [Log("warning", "probe.failed", {
        "probe": kind, "error": error, "consecutive": n, "threshold": threshold})]
    if n >= threshold:
        s, more = begin_restart(s, now, Reason.HEALTH, f"{kind} failed {n} times in a row: {error}",
                                drain=False)
        acts += more
    return s, acts


def canary(s: WatchState, ev: CanaryResult, now: float) -> Result:
    """A real completion: the last step to READY, and the hang detector while serving."""
    kind = K.WARMUP if ev.warmup else K.CANARY
    s = replace(s, probe_seconds={**s.probe_seconds, kind: ev.seconds})
    if ev.ok and ev.kind is not None:  # `auto` found the model's kind: later canaries use it
        s = verdicts.found_kind(s, ev.kind)
    if s.state == S.STARTING:
        return _starting_canary(s, ev, now)
    if s.state != S.READY or ev.warmup:
        return s, []
    c = _run(s)
    if ev.ok:
        s = _engine(s, replace(c.engine, canary_failures=0))
        return verdicts.answered(s, ev.seconds, serving=True), []
    if not hangs.judge_canary(c.canary.asleep, c.engine.asleep):
        return s, [Log("info", "probe.canary_asleep", {
            "error": ev.error or "timed out", "detail": "vLLM is in sleep mode; not judged"})]
    if ev.timed_out:
        # Health says 200 but a 1-token completion did not come back: hung, or merely busy.
        # A fresh scrape decides (_canary_verdict).
        s = probing.set_timer(verdicts.suspect(s, True), K.METRICS, now)
        return s, [Log("warning", "probe.canary_timeout", {
            "timeout_s": c.canary.timeout_s, "retry": c.canary.is_retry,
            "detail": "checking whether the engine is busy or hung"})]
    return _probe_failed(s, now, K.CANARY, ev.error)


def _starting_canary(s: WatchState, ev: CanaryResult, now: float) -> Result:
    c = _run(s)
    if c.smoke is not None:  # the smoke checks run: this start's canary is decided
        return s, []
    if not ev.ok:
        if ev.warmup:  # a failed warm-up is worth a warning, not a failed start
            return checks_then_ready(s, now, [
                Log("warning", "startup.warmup_failed", {"error": ev.error})])
        s = _start(s, replace(c.start, canary_said=ev.error or "timed out"))
        return s, [Log("debug", "startup.canary_not_yet", {"error": ev.error})]
    if not ev.warmup:
        phases = {**c.start.phases, "canary": round(now - c.started, 3)}
        s = verdicts.answered(_start(s, replace(c.start, phases=phases)), ev.seconds,
                              serving=False)
        if s.config.prewarm.enabled and s.config.prewarm.warmup_request:
            return probing.start(s, K.WARMUP, now)
    return checks_then_ready(s, now, [])


def checks_then_ready(s: WatchState, now: float, acts: list[Action]) -> Result:
    """The canary passed: the smoke checks first when the config has some, then READY.

    [[adapters]] (issue 38.1) adds its 1-token checks in core/smoke.checks(), and its
    condition here."""
    if not s.config.smoke and not s.config.adapters:
        return become_ready(s, now, acts)
    from vllmwatch.core import smoke  # only when configured: the daemon's import count

    s, acts, done = smoke.begin(s, acts)
    return become_ready(s, now, acts) if done else (s, acts)


def become_ready(s: WatchState, now: float, acts: list[Action]) -> Result:
    """READY: the probes' timers, the leak rules' start, READY=1 to systemd."""
    c = _run(s)
    st = c.start
    took = now - c.started
    phases = {**st.phases, "ready": round(took, 3)}
    s, more = goto(s, S.READY, now, "health 200 and a real completion succeeded")
    done = [Log("info", "restart.done", policy.outage_done(s.outage, s.last_reason, now))
            ] if s.restart.reason is not None and s.outage is not None else []
    s = replace(s, ever_ready=True, outage=None)
    s = probing.serving(_start(s, replace(st, ready_at=now, phases=phases)), now)
    s = _mem(s, replace(c.mem, leak=leak.new_state(now)))
    s = _engine(s, replace(c.engine, health_failures=0, canary_failures=0))
    log = Log("info", "child.ready", {"pid": c.pid, "startup_s": round(took, 2),
                                      "phases": phases, "compile_cache_hit": st.compile_cache_hit,
                                      "reuse": dict(st.reuse)})
    awake = s.spare is not None and str(s.spare.rung) in ("serving", "waking")  # a failover
    now_hits = reuse.hits(st.reuse, st.compile_cache_hit)
    now_inputs = reuse.launched(st.inputs or reuse.inputs(s.config), c.proc.inputs)  # the launch's
    acts = [*acts, *more, log, *reuse.missed_logs(s.last_hits, s.last_inputs, now_hits,
                                                  st.reuse, now_inputs, awake)]
    s = replace(s, last_hits=reuse.kept(s.last_hits, now_hits, awake), last_inputs=now_inputs)
    s, more = rung(s, Phase.IDLE, now, "ready")
    s, back = spare_ready(s, now)  # the gate routes back to the full engine first
    return s, [*acts, *done, *more, *back, Notify(ready=True)]


def metrics(s: WatchState, ev: MetricsResult, now: float) -> Result:
    """A /metrics scrape: busy-vs-hung, stall detection, and the drain's end."""
    s = replace(s, probe_seconds={**s.probe_seconds, K.METRICS: ev.seconds})
    c = _run(s)
    if not ev.ok:
        s = replace(s, probe_failures={**s.probe_failures,
                                    K.METRICS: s.probe_failures.get(K.METRICS, 0) + 1})
        if s.state == S.READY and c.canary.suspect:
            return verdicts.on_canary_timeout(s, False, ev.host_cpu, now,
                                              "/metrics failed: " + ev.error)
        if s.state == S.DRAINING:
            return drain_look(s, now, None, None)
        return s, [Log("debug", "probe.metrics_failed", {"error": ev.error})]
    acts: list[Action] = []
    e = c.engine
    if ev.asleep != e.asleep and (ev.asleep or e.asleep):
        acts.append(Log("info", "vllm.sleep_state", {
            "asleep": ev.asleep, "detail": "put to sleep: no canary, no hang or stall verdict "
            "until it wakes" if ev.asleep else "awake again"}))
    s = _engine(s, replace(e, running=ev.running, waiting=ev.waiting,
                           kv_cache_usage=ev.kv_cache_usage, asleep=ev.asleep))
    cur = policy.progress_of(now, ev.running, ev.waiting, ev.prompt_tokens,
                             ev.generation_tokens, ev.kv_cache_usage)
    prev = e.progress
    if s.state == S.DRAINING:
        s, more = drain_look(s, now, ev.running, ev.waiting)
    elif s.state == S.READY and cur is None and c.canary.suspect:
        # A timed-out canary needs a verdict from this scrape: without the series (vLLM run
        # with --disable-log-stats) nothing can be seen to move. Waiting for a series that
        # never comes would keep the suspicion, and so every later canary, off for good.
        s, more = verdicts.on_canary_timeout(s, False, ev.host_cpu, now, "/metrics carries "
                                             "no progress series (--disable-log-stats?)")
    elif s.state != S.READY or cur is None:
        s, more = _engine(s, replace(s.run.engine, progress=cur or prev)), []
    else:
        if c.canary.ref is None and (K.CANARY in c.probes.inflight or c.canary.suspect):
            s = verdicts.first_scrape(s, cur)  # first scrape since the send
        s, more = _judge_progress(_engine(s, replace(s.run.engine, progress=cur)), prev, cur,
                                  now, ev.host_cpu)
    return s, acts + more


def _judge_progress(s: WatchState, prev: policy.Progress | None, cur: policy.Progress,
                    now: float, cpu: hangs.HostCpu | None) -> Result:
    c = _run(s)
    acts: list[Action] = []
    if c.canary.suspect and not hangs.judge_canary(c.canary.asleep, c.engine.asleep):
        s = verdicts.suspect(s, False)
        acts.append(Log("info", "probe.canary_asleep", {
            "error": "timed out", "detail": "vLLM is in sleep mode; not judged"}))
    elif c.canary.suspect:
        # Against the first scrape after the canary was sent (probing.send_canary), not one
        # from before the send, which may predate the hang; and at least hangs.VERDICT_SPAN
        # older than this one, so that a working engine has had time to move a counter.
        ref = c.canary.ref if c.canary.ref is not None else cur
        moved = policy.moved(ref, cur)
        if not moved and now - ref.at < hangs.VERDICT_SPAN:
            return probing.set_timer(s, K.METRICS, ref.at + hangs.VERDICT_SPAN), acts
        s, acts = verdicts.on_canary_timeout(s, moved, cpu, now, "nothing the engine reports "
                                             "moved (tokens, queue, KV cache)")
        if pending(s) is not None:
            return s, acts
    s, more = verdicts.frozen(s, prev, cur, now, cpu)
    acts += more
    if pending(s) is not None:
        return s, acts
    stall = policy.stalled_since(c.engine.stall_since, prev, cur)
    s = _engine(s, replace(s.run.engine, stall_since=stall))
    if stall is not None and now - stall >= s.config.probe.stall_timeout \
            and hangs.judge_stall(c.engine.asleep):
        s, more = begin_restart(s, now, Reason.STALL,
                                f"{cur.running:g} running and {cur.waiting:g} waiting, but "
                                f"no token generated for {now - stall:.0f}s", drain=False)
        acts += more
    return s, acts


def memory(s: WatchState, ev: MemorySampled, now: float) -> Result:
    """A memory sample: feed the leak rules while serving."""
    sample = ev.sample
    if sample is None:
        return s, [Log("warning", "memory.sample_failed", {"error": ev.error})]
    s = probing.sampled(s, sample)
    if sample.gpu_faults:  # a hardware fault ends supervision: restarts would only loop
        (s, fault_acts), ends = gpufault.react(s, sample.gpu_faults, now)
        if ends:
            return s, fault_acts
        s, rest = memory(s, replace(ev, sample=replace(sample, gpu_faults=())), now)
        return s, [*fault_acts, *rest]
    m = _run(s).mem
    host = host_figure(m.host, sample, now, fixed=m.leak is not None)
    s = _mem(s, replace(m, host=host))
    st = _run(s).start
    if s.state == S.STARTING and sample.tree_cpu_s is not None:
        cpu = hangs.mark_cpu(st.cpu_since_progress, st.last_progress, now, sample.tree_cpu_s)
        s = _start(s, replace(st, cpu_since_progress=cpu))
    if s.state != S.READY or m.leak is None:
        return s, []
    gpu, host_mib = gpu_figure(sample, host.mib), host.mib if host.fresh else None
    state, verdict = leak.observe(m.leak, s.config.memory, now, gpu, host_mib, gpu_kind(sample))
    judged = None if state.gpu.other is not None else gpu  # another kind: unknown to the rules
    recent = (*m.recent, (now, judged, host_mib))[-MEM_RECENT:]
    s = _mem(s, replace(s.run.mem, leak=state, recent=recent))
    waiting, acts, fires = leak.judge_hold(s.run.mem.waiting, verdict,
                                           s.config.restart.quiet_hours, ev.minute_of_day, now)
    acts = [*leak.restarted_log(m.leak, state), *acts]
    s = _mem(s, replace(s.run.mem, waiting=waiting))
    if verdict is None or not fires:
        return s, acts
    unit = "mib_per_h" if verdict.rule.endswith("_rate") else "mib"  # (a slope: not a size)
    acts.append(Log("warning", "memory.rule_fired", {
        "rule": verdict.rule, f"value_{unit}": round(verdict.value, 1),
        f"limit_{unit}": round(verdict.limit, 1), "source": sample.source,
        "detail": verdict.detail}))
    s, more = begin_restart(s, now, verdict.reason, verdict.detail, drain=True)
    return s, acts + more
