"""From the core's state to the published Snapshot, and the one-line STATUS= summary."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from vllmwatch.config.hosts import parse_listen, url_host
from vllmwatch.config.redact import REDACT
from vllmwatch.config.schema import Config, VllmConfig
from vllmwatch.config.units import CUT, brief, format_duration, format_mib
from vllmwatch.core import drain as drains
from vllmwatch.core import exitcodes, leak
from vllmwatch.core.names import Reason
from vllmwatch.core.restart import Phase
from vllmwatch.core.samples import gpu_figure
from vllmwatch.core.state import ChildRun, S, WatchState
from vllmwatch.status.snapshot import MemoryFigures, Snapshot, ladder_word


def _limit(mib: float) -> float | None:
    return mib if mib > 0 else None  # 0 turns a limit off


def completions(c: ChildRun | None, prev: Snapshot, to_wall: Callable[[float], float]
                ) -> dict[str, float]:
    """When each probe kind last completed (wall clock): the current child's results over
    those of earlier children, so a restart does not make the figures vanish."""
    done = dict(prev.probe_last_completed)
    if c is not None:
        done.update({str(kind): round(to_wall(t), 3) for kind, t in c.probes.done_at.items()})
    return done


def _memory(s: WatchState, now: float) -> MemoryFigures:
    c = s.child
    m = c.probes.memory if c is not None else None
    cfg = s.config.memory
    gpu_limit, host_limit = _limit(cfg.gpu_limit), _limit(cfg.host_limit)
    if c is None or m is None:
        return MemoryFigures(gpu_limit_mib=gpu_limit, host_limit_mib=host_limit)
    host = c.mem.host  # the figure the rules use: one kind, PSS carried between PSS samples
    hold = c.mem.waiting.hold
    gpu_base = host_base = gpu_slope = host_slope = None
    if c.mem.leak is not None:
        gpu_base, host_base, gpu_slope, host_slope = leak.figures(c.mem.leak)
    return MemoryFigures(
        source=m.source, gpu_tree_mib=m.gpu_tree_mib,
        gpu_tree_by_gpu_mib=dict(m.gpu_tree_by_gpu_mib), device_used_mib=dict(m.device_used_mib),
        device_total_mib=dict(m.device_total_mib), host_rss_mib=m.host_rss_mib,
        host_pss_mib=m.host_pss_mib, gpu_baseline_mib=gpu_base, host_baseline_mib=host_base,
        gpu_slope_mib_per_h=gpu_slope, host_slope_mib_per_h=host_slope,
        gpu_rule_mib=gpu_figure(m, host.mib if host is not None else m.host_rule_mib),
        host_rule_mib=host.mib if host is not None else None,
        host_rule_source=host.kind if host is not None else None,
        host_rule_age_s=round(now - host.at, 3) if host is not None else None,
        gpu_limit_mib=gpu_limit, host_limit_mib=host_limit,
        held_rule=hold.rule if hold is not None else None,
        held_for_s=round(now - hold.since, 1) if hold is not None else None,
        held_detail=hold.detail if hold is not None else None)


def serving_url(vllm: VllmConfig, config: Config) -> str:
    """The base URL clients use: the [gate] front door when it is on, else vLLM's own
    address (the child's [vllm]: a reload does not move a running vLLM). A wildcard host is
    shown as bound ("0.0.0.0": every interface)."""
    scheme = "http"  # (vLLM's own TLS flags are refused: config/flags.OFF_THE_PROBES)
    host, port = vllm.host, vllm.port
    if config.gate.enabled:  # a bad listen was refused at load; never crash a snapshot on it
        with contextlib.suppress(ValueError):
            host, port = parse_listen(config.gate.listen) or (host, port)
    return f"{scheme}://{url_host(host or '0.0.0.0')}:{port}"


def snapshot_of(s: WatchState, now: float, wall: float, prev: Snapshot,
                vllm_version: str | None) -> Snapshot:
    """Build the immutable snapshot that /status, /metrics and STATUS= show."""
    def to_wall(t: float | None) -> float | None:
        return None if t is None else wall - (now - t)

    def at_wall(t: float) -> float:
        return wall - (now - t)

    state_since = to_wall(s.since) or wall
    c = s.child
    alive = c is not None and c.pid is not None
    return Snapshot(
        state=str(s.state), state_since=state_since, state_since_monotonic=s.since,
        ready=_ready(s),
        draining=s.state == S.DRAINING, child_pid=s.pid,
        restart_phase=str(s.restart.phase), restart_phase_since_monotonic=s.restart.since,
        restart_phase_for_s=round(max(0.0, now - s.restart.since), 3),
        restart_reason=None if s.restart.reason is None else str(s.restart.reason),
        child_started=to_wall(c.started) if c is not None and alive else None,
        child_uptime_s=round(now - c.started, 3) if c is not None and alive else None,
        restarts_by_reason={str(k): n for k, n in s.restarts_by_reason.items()},
        last_reason=str(s.last_reason) if s.last_reason is not None else None,
        last_reason_detail=s.last_detail, last_restart_at=to_wall(s.last_restart_at),
        exit_code=s.exit_code, exit_reason=None if s.exit_reason is None else str(s.exit_reason),
        exit_detail=s.exit_detail or None,
        start_phases_s=dict(c.start.phases) if c is not None else {},
        start_reuse={**c.start.reuse, "compile_cache_hit": c.start.compile_cache_hit} if c
        else {},
        memory=_memory(s, now),
        vllm_running=c.engine.running if c else None,
        vllm_waiting=c.engine.waiting if c else None,
        vllm_kv_cache_usage=c.engine.kv_cache_usage if c else None,
        stale_probes=tuple(str(k) for k in c.probes.stale) if c is not None else (),
        canary_unanswered_s=round(now - c.canary.busy_since, 1)
        if c is not None and alive and c.canary.busy_since is not None else None,
        busy_timeout_s=s.config.probe.busy_timeout,
        next_launch_in_s=round(max(0.0, s.deadline - now), 1)
        if s.state == S.BACKOFF and s.deadline is not None else None,
        probe_seconds={str(k): v for k, v in s.probe_seconds.items()},
        probe_failures={str(k): n for k, n in s.probe_failures.items()},
        config_path=s.config.path, config_sha256=s.config.sha256,
        reload_refused=s.reload_refused or None,
        vllm_version=vllm_version, loop_heartbeat=now,
        probe_last_completed=completions(c, prev, at_wall),
        model=(c.vllm if c else s.config.vllm).model_name,
        serving_url=serving_url(c.vllm if c else s.config.vllm, s.config),
        drain_phase=str(drains.phase(c.drain, now)) if c and c.drain else None,
        drain_phases_s=drains.durations(c.drain, now) if c and c.drain else dict(s.last_drain),
        vllm_asleep=c.engine.asleep if c else None,
        last_incident=s.last_incident, incidents_total=s.incidents_total,
        serving=_serving(s), spare=_spare(s, now, wall), smoke_checks=_smoke(c))


def _ready(s: WatchState) -> bool:
    """What /readyz, /status "ready", vllmwatch_ready and STATUS= call ready: READY with no
    restart under way. An unplanned restart's first rung (RECORDING: the incident record,
    before the tree is touched) keeps the coarse state READY while the engine is dead or
    stuck; the gate already held its clients then (gate/door.readiness_of), but /readyz said
    200 to the balancers for up to incidents.timeout + 1 s."""
    return s.state == S.READY and s.restart.phase == Phase.IDLE


def _serving(s: WatchState) -> str:
    """Who answers the gate's clients: the spare while it serves (core/failover.who_serves,
    not imported: the spare's modules load only when it is on)."""
    if s.spare is not None and s.spare.rung == "serving":
        return "spare"
    return "full" if _ready(s) else "nobody"


def _spare(s: WatchState, now: float, wall: float) -> dict[str, object] | None:
    """The spare's part of /status; `since` (wall clock) and `for_s`: when it came to its
    state and how long it is there (serving: how long clients have had the smaller engine)."""
    t = s.spare
    if t is None:
        return None
    why = t.down_why if t.rung == "down" and t.down_why else t.why  # down: why, not the plan
    # A failover under way (core/sparetrack.under_way, not imported): begun, not serving yet
    began = t.began if t.rung != "serving" else None
    return {"state": str(t.rung), "since": round(wall - (now - t.since), 3),
            "for_s": round(max(0.0, now - t.since), 3), "build": t.build, "why": why, "pid": t.pid,
            "failover_for_s": None if began is None else round(max(0.0, now - began), 3),
            "awake_mib": t.awake_mib,
            "asleep_mib": t.asleep_mib, "failed_builds": t.failed_builds,
            "failovers": t.failovers, "last_failover_s": t.last_seconds}


def _smoke(c: ChildRun | None) -> tuple[dict[str, Any], ...]:
    """This start's smoke checks; core/smoke.py is imported only when a start has some."""
    if c is None or c.smoke is None:
        return ()
    from vllmwatch.core import smoke

    return tuple(smoke.view(c.smoke))


# What a failover under way waits on, by the spare's rung (any other: its name)
_FAILOVER = {"waking": "waking", "asleep": "wake deferred to the old tree's GPU release",
             "returning": "wake deferred until it sleeps again"}
STATUS_WIDTH = 200  # the STATUS= line's most characters (shell/notify.status_line cuts there)
_FREE_MIN = 16  # what a shortened free-text part keeps: its start names it ("gate down: [Errn")

# A part of the line: its fixed words, its free text (a message of another's: shortened first
# when the line is too long, "" for none), and its fixed end.
_Part = tuple[str, str, str]


def summary(snap: Snapshot, down: tuple[str, ...] = ()) -> str:
    """One line for systemctl status: state, uptime, restarts, last reason, memory; `down`:
    parts of vllmwatch itself that are down (the gate), said right after the state. At most
    STATUS_WIDTH characters: the free text (a gate's error, a refused reload's, an exit's
    detail) is shortened before any fixed word goes."""
    # "ready" only while it is (_ready): a restart's rung that leaves the coarse state READY
    # (the incident record of a crash) began the line "ready" beside "restart recording"
    parts: list[_Part] = [("not ready" if snap.state == "ready" and not snap.ready
                           else snap.state, "", "")]
    parts += [("", REDACT.head(words, 120), "") for words in down]
    if snap.reload_refused:  # systemd heard READY=1 (the reload over): what was not taken.
        # Its start: the file, line, key and value come first (the journal has the rest)
        head = REDACT.head(snap.reload_refused, 120)
        parts.append(("reload refused: ", head + ("..." if len(head) == 120 else ""), ""))
    if snap.exit_reason is not None and snap.exit_reason != Reason.STOP:
        # Leaving for a cause: said first, until the process is gone (a crash-loop give-up
        # read "stopping | ... | last crash", a crash restart it seemed; the exit code and
        # why were in the journal alone). A requested stop is "stopping" already.
        detail = brief(snap.exit_detail, 100) if snap.exit_detail else ""
        parts.append((f"exiting {snap.exit_code}: {snap.exit_reason}" + (" (" if detail else ""),
                      detail, ")" if detail else ""))  # its cause, its last failure, is last
    if snap.serving == "spare":  # issue 34: clients are answered, by the smaller engine
        took = (snap.spare or {}).get("for_s")
        parts.append(("degraded: spare serving" + (f" for {format_duration(took)}" if
                                                   isinstance(took, (int, float)) else ""),
                      "", ""))
    elif isinstance(going := (snap.spare or {}).get("failover_for_s"), (int, float)):
        # Begun, not serving yet: the gate holds its clients while the spare wakes (or waits
        # for room); "restart recording" alone hid that a failover was on its way, or stuck
        state = (snap.spare or {}).get("state")
        parts.append((f"failover: spare {_FAILOVER.get(str(state), str(state))} for "
                      f"{format_duration(going)}", "", ""))
    if snap.restart_phase != "idle" and snap.state not in ("stopped", "failed"):  # the rung
        # of the restart (or exit) under way; none once the daemon is done
        word = ladder_word(snap.restart_phase, snap.restart_reason, snap.exit_reason)
        parts.append((f"{word} {snap.restart_phase} for "
                      f"{format_duration(snap.restart_phase_for_s or 0.0)}"
                      + (f", next launch in {format_duration(snap.next_launch_in_s)}"
                         if snap.next_launch_in_s is not None else ""), "", ""))
    if snap.child_uptime_s is not None:
        parts.append((f"up {format_duration(snap.child_uptime_s)}", "", ""))
    parts.append((f"restarts {snap.restarts_total}", "", ""))
    if snap.canary_unanswered_s is not None:  # "ready" alone hid a wedged API server
        parts.append((f"canary unanswered {format_duration(snap.canary_unanswered_s)}", "", ""))
    held = [c["name"] for c in snap.smoke_checks if c.get("result") == "failed"
            and c.get("required") and snap.state == "starting"]
    if held:  # the start waits for startup.timeout: say why it is not READY
        parts.append(("READY held: smoke check ", str(held[0]), " failed"))
    if snap.last_reason == Reason.START_MEMORY and snap.last_reason_detail:
        # The operator's next step depends on the numbers ("page cache held N GiB at start").
        parts.append(("last start_memory: ", snap.last_reason_detail, ""))
    elif snap.last_reason:
        parts.append((f"last {snap.last_reason}", "", ""))
    parts += [(words, "", "") for words in memory_words(snap.memory)]
    return _fit(parts, STATUS_WIDTH)


def _fit(parts: list[_Part], width: int) -> str:
    """The parts joined by " | " in at most `width` characters where the fixed words allow:
    the longest free text is shortened first, none below _FREE_MIN. Cut at the end alone
    (status_line's cut), a long gate error or refused reload took the exit, the spare
    serving and the restart's rung that follow it off the line."""
    free = [p[1] for p in parts]

    def line() -> str:
        return " | ".join(head + body + end for (head, _, end), body in zip(parts, free,
                                                                            strict=True))

    while (over := len(line()) - width) > 0:
        longest = sorted(range(len(free)), key=lambda i: len(free[i]), reverse=True)
        i = longest[0]
        if len(free[i]) <= _FREE_MIN:
            break  # the fixed words alone are too long: status_line's cut ends it
        runner_up = len(free[longest[1]]) if len(longest) > 1 else 0
        keep = min(len(free[i]) - 1,  # (a tie with the runner-up: one character at a time)
                   max(_FREE_MIN, runner_up, len(free[i]) - over))
        free[i] = _shorten(parts[i][1], keep)
    return line()


def _shorten(text: str, keep: int) -> str:
    """`text` (redacted already) in at most `keep` characters: its start and its end where
    there is room for both (a start-memory detail's cause, "page cache held N GiB", is said
    last), else its start."""
    if keep >= 2 * _FREE_MIN + len(CUT):
        cut = brief(text, keep)
        if len(cut) <= keep:
            return cut
    return text[:keep - 3].rstrip() + "..."


def memory_words(mem: MemoryFigures) -> list[str]:
    """The child tree's memory in the words `vllmwatch status` uses: "gpu tree 34.2GiB",
    "host pss 3.8GiB" (rss only where no PSS was read), so both name the same figure."""
    out = []
    if mem.gpu_tree_mib is not None:
        out.append(f"gpu tree {format_mib(mem.gpu_tree_mib)}")
    if mem.host_pss_mib is not None:
        out.append(f"host pss {format_mib(mem.host_pss_mib)}")
    elif mem.host_rss_mib is not None:
        out.append(f"host rss {format_mib(mem.host_rss_mib)}")
    if mem.held_rule is not None:
        out.append(f"memory restart waits for quiet hours ({mem.held_rule})")
    return out


def own_unit(path: str = "/proc/self/cgroup") -> exitcodes.Unit | None:
    """The service unit this process runs as ("vllmwatch@gpu1", a user manager's or the
    system's), from its cgroup: what every hint's systemctl/journalctl command names
    (exitcodes.systemctl); NO_SERVICE when the cgroup names none (a container, a terminal);
    None when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return exitcodes.unit_in(f.read()) or exitcodes.NO_SERVICE
    except OSError:
        return None


def systemctl(verb: str) -> str:
    """exitcodes.systemctl for the unit this process runs as."""
    return exitcodes.systemctl(own_unit(), verb)
