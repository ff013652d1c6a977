"""From the core's state to the published Snapshot, and the one-line STATUS= summary."""

from __future__ import annotations

from vllmwatch.config.units import format_duration, format_mib
from vllmwatch.core.state import S, WatchState
from vllmwatch.status.snapshot import MemoryFigures, Snapshot


def _limit(mib: float) -> float | None:
    return mib if mib > 0 else None  # 0 turns a limit off


def completions(s: WatchState, prev: Snapshot, wall: float) -> dict[str, float]:
    """When each probe kind last completed (wall clock), carried over from `prev`.

    A result replaces the core's probe_seconds (or memory sample) object with a new one, so
    an object that is not the one `prev` saw means a result arrived in this turn, and a
    changed duration or failure count says which kind. Results about an older child are
    dropped by the core before they touch either, so they do not count.
    """
    done = dict(prev.probe_last_completed)
    seen = prev.seen if len(prev.seen) == 3 else (None, None, None)
    if s.probe_seconds is not seen[0] or s.probe_failures is not seen[1]:
        old_s = seen[0] if isinstance(seen[0], dict) else {}
        old_f = seen[1] if isinstance(seen[1], dict) else {}
        for kind in {*s.probe_seconds, *s.probe_failures}:
            if (s.probe_seconds.get(kind) != old_s.get(kind)
                    or s.probe_failures.get(kind) != old_f.get(kind)):
                done[kind] = wall
    if s.memory is not None and s.memory is not seen[2]:
        done["memory"] = wall
    return done


def _memory(s: WatchState) -> MemoryFigures:
    m = s.memory
    cfg = s.config.memory
    if m is None:
        return MemoryFigures(gpu_limit_mib=_limit(cfg.gpu_limit),
                             host_limit_mib=_limit(cfg.host_limit))
    gpu_base = host_base = gpu_slope = host_slope = None
    if s.leak is not None:
        from vllmwatch.core import leak

        gpu_base, host_base, gpu_slope, host_slope = leak.figures(s.leak)
    return MemoryFigures(
        source=m.source, gpu_tree_mib=m.gpu_tree_mib,
        gpu_tree_by_gpu_mib=dict(m.gpu_tree_by_gpu_mib), device_used_mib=dict(m.device_used_mib),
        device_total_mib=dict(m.device_total_mib), host_rss_mib=m.host_rss_mib,
        host_pss_mib=m.host_pss_mib, gpu_baseline_mib=gpu_base, host_baseline_mib=host_base,
        gpu_slope_mib_per_h=gpu_slope, host_slope_mib_per_h=host_slope,
        gpu_rule_mib=m.gpu_rule_mib, host_rule_mib=m.host_rule_mib,
        gpu_limit_mib=_limit(cfg.gpu_limit), host_limit_mib=_limit(cfg.host_limit))


def snapshot_of(s: WatchState, now: float, wall: float, prev: Snapshot,
                vllm_version: str | None) -> Snapshot:
    """Build the immutable snapshot that /status, /metrics and STATUS= show."""
    def to_wall(t: float | None) -> float | None:
        return None if t is None else wall - (now - t)

    state_since = to_wall(s.since) or wall
    return Snapshot(
        state=str(s.state), state_since=state_since, state_since_monotonic=s.since,
        ready=s.state == S.READY,
        draining=s.state == S.DRAINING, child_pid=s.pid,
        child_started=to_wall(s.child_started) if s.pid else None,
        child_uptime_s=round(now - s.child_started, 3) if s.pid and s.child_started else None,
        restarts_by_reason=dict(s.restarts_by_reason), last_reason=s.last_reason,
        last_reason_detail=s.last_detail, last_restart_at=to_wall(s.last_restart_at),
        start_phases_s=dict(s.phases),
        memory=_memory(s),
        vllm_running=s.running, vllm_waiting=s.waiting, vllm_kv_cache_usage=s.kv_cache_usage,
        probe_seconds=dict(s.probe_seconds), probe_failures=dict(s.probe_failures),
        config_path=s.config.path, config_sha256=s.config.sha256,
        vllm_version=vllm_version, loop_heartbeat=now,
        probe_last_completed=completions(s, prev, wall), model=s.config.vllm.model_name,
        seen=(s.probe_seconds, s.probe_failures, s.memory))


def summary(snap: Snapshot) -> str:
    """One line for systemctl status: state, uptime, restarts, last reason, memory."""
    parts = [snap.state]
    if snap.child_uptime_s is not None:
        parts.append(f"up {format_duration(snap.child_uptime_s)}")
    parts.append(f"restarts {snap.restarts_total}")
    if snap.last_reason:
        parts.append(f"last {snap.last_reason}")
    mem = snap.memory
    if mem.gpu_tree_mib is not None:
        parts.append(f"gpu {format_mib(mem.gpu_tree_mib)}")
    host = mem.host_pss_mib if mem.host_pss_mib is not None else mem.host_rss_mib
    if host is not None:
        parts.append(f"host {format_mib(host)}")
    return " | ".join(parts)
