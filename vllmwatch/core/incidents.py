"""Pure: when an incident record is written, and what the core puts in it.

Every restart that nobody asked for (every reason but `manual` (SIGUSR1) and `reload`) and
every exit that is not a requested stop (crash-loop give-up 3, start memory 5, GPU fault 6)
asks the shell for a record (RecordIncident) BEFORE the child is signalled, so that a hung
tree can still be read. The ladder then waits for IncidentRecorded, at most the record's
timeout plus WAIT_MARGIN, and goes on whatever happens: a record can delay a restart by a
few seconds, never stop it.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from vllmwatch.core.actions import Action, Log, RecordIncident
from vllmwatch.core.leak import SeriesState
from vllmwatch.core.names import Reason
from vllmwatch.core.restart import IncidentWait, Phase
from vllmwatch.core.restart import goto as rung
from vllmwatch.core.state import Result, S, WatchState

REQUESTED = frozenset({Reason.MANUAL, Reason.RELOAD})  # restarts a person asked for
# Exits that are not a requested stop, and not a refusal to start: each gets a record.
EXITS = frozenset({Reason.CRASHLOOP, Reason.START_MEMORY, Reason.GPU_FAULT})
STATES = frozenset({S.STARTING, S.READY, S.DRAINING})  # where a child can still be read
WAIT_MARGIN = 1.0  # the core's own deadline beyond the shell's, should its answer be lost
MEMORY_REASONS = frozenset({Reason.GPU_MEMORY, Reason.HOST_MEMORY})
SAMPLES_KEPT = 120  # the newest leak-rule points of each series put in a record


def wanted(s: WatchState, reason: Reason) -> bool:
    """Whether a restart (or an exit) for `reason` gets a record."""
    return s.config.incidents.enabled and reason not in REQUESTED


def request(s: WatchState, now: float, reason: Reason, detail: str, drain: bool) -> Result:
    """Ask for the record and hold the ladder until it is written (or its deadline)."""
    timeout = s.config.incidents.timeout
    seq = s.incident_seq + 1
    code = s.exit_code  # halt sets it before asking
    wait = IncidentWait(seq=seq, until=now + timeout + WAIT_MARGIN, drain=drain, started=now,
                        reason=reason)
    s, acts = rung(replace(s, incident_seq=seq, deadline=wait.until), Phase.RECORDING, now,
                   "the incident record first", wait=wait)
    c = s.child
    acts += [RecordIncident(seq, reason, detail, timeout,
                                         c.proc.pgid if c is not None else None, code,
                                         facts(s, now, reason), s.config.incidents)]
    return s, acts


def recorded(s: WatchState, seq: int, incident_id: str, path: str, error: str, seconds: float,
             stacks: str) -> tuple[WatchState, list[Action], IncidentWait | None]:
    """The shell's answer: (state, logs, the wait it ends); the wait is None for a stale one."""
    wait = s.restart.wait
    if wait is None or wait.seq != seq:
        return s, [], None
    s = replace(s, deadline=None)
    if error:  # (the last record is not this restart's: status must not pair them)
        s = replace(s, last_incident=None)
        return s, [Log("warning", "incident.failed", {
            "error": error, "detail": "no incident record for this restart; the restart "
            "goes on"})], wait
    s = replace(s, incidents_total=s.incidents_total + 1, last_incident=incident_id)
    # The restart's event that names its record (journald: VLLMWATCH_INCIDENT=, ..._PATH=).
    return s, [Log("warning", "incident.recorded", {
        "reason": wait.reason, "incident": incident_id, "incident_path": path,
        "seconds": round(seconds, 3), "stacks": stacks,
        "hint": f"vllmwatch incidents show {incident_id}"})], wait


def timed_out(s: WatchState, now: float) -> tuple[WatchState, list[Action], IncidentWait]:
    """No answer by the core's deadline: go on without the record."""
    wait = s.restart.wait
    assert wait is not None
    s = replace(s, deadline=None, last_incident=None)  # (as for a failed one)
    return s, [Log("warning", "incident.timeout", {
        "waited_s": round(now - wait.started, 2), "detail": "the incident record did not "
        "come back in time; the restart goes on without waiting for it"})], wait


def facts(s: WatchState, now: float, reason: Reason) -> dict[str, Any]:
    """What the core knows about this child run, JSON-ready, times relative to `now`."""
    c = s.child
    out: dict[str, Any] = {
        "state": str(s.state), "state_for_s": round(now - s.since, 3),
        "restarts_by_reason": dict(s.restarts_by_reason), "failures_in_row": s.failures,
        "config_path": s.config.path, "config_sha256": s.config.sha256,
    }
    if s.outage is not None and s.outage[2] > 1:  # a relaunch failed: whose outage this is
        out["outage"] = {"began_with": str(s.outage[1]), "began_s_ago": round(now - s.outage[0], 3),
                         "restarts": s.outage[2]}
    t = s.spare
    if t is not None:  # issue 34: the failover as the take-down begins (the record follows
        # the wake; failover.served and failover.returned in the journal give its seconds)
        out["failover"] = {"spare": str(t.rung), "why": t.why, "failovers": t.failovers,
                           "began_s_ago": None if t.began is None else round(now - t.began, 3),
                           "last_failover_s": t.last_seconds}
    if c is None:
        return out
    st, e, sample = c.start, c.engine, c.probes.memory
    out.update({
        # pid: None once the core saw it exit; exited_pid keeps it, the gate's generation key
        # (a crash's record looked up the figures of no engine: "0 requests in flight")
        "gen": c.gen, "pid": c.pid, "exited_pid": c.proc.exited_pid, "pgid": c.proc.pgid,
        "uptime_s": round(now - c.started, 3),
        "ready_for_s": None if st.ready_at is None else round(now - st.ready_at, 3),
        "start_phases_s": dict(st.phases), "compile_cache_hit": st.compile_cache_hit,
        "start_reuse": dict(st.reuse),
        "health_failures": e.health_failures, "canary_failures": e.canary_failures,
        "hang_suspect": c.canary.suspect, "engine_gone": e.engine_gone,
        "running": e.running, "waiting": e.waiting, "kv_cache_usage": e.kv_cache_usage,
        "progress_age_s": round(now - st.last_progress, 3),
        "canary_verdicts": [[round(t - now, 3), what] for t, what in c.canary.verdicts],
        "last_sample": None if sample is None else asdict(sample),
    })
    if reason in MEMORY_REASONS:
        # The samples the rules judged (newest last): the last `sustain` of them fired it.
        out["memory_samples"] = {
            "sustain": s.config.memory.sustain,
            "recent": [{"s_ago": round(now - t, 3), "gpu_rule_mib": gpu, "host_rule_mib": host}
                       for t, gpu, host in c.mem.recent]}
        if c.mem.leak is not None:
            out["memory_samples"].update({"gpu": _series(c.mem.leak.gpu, now),
                                          "host": _series(c.mem.leak.host, now)})
    return out


def _series(series: SeriesState, now: float) -> dict[str, Any]:
    """One leak series: baseline, slope and the newest points as (seconds ago, MiB)."""
    points = series.points[-SAMPLES_KEPT:]
    return {"source": series.source, "baseline_mib": series.baseline,
            "slope_mib_per_h": series.slope,
            "streaks": {"limit": series.limit_streak, "growth": series.growth_streak,
                        "rate": series.rate_streak},
            "points": [[round(now - t, 3), round(v, 3)] for t, v in points]}
