"""The immutable picture of the daemon that the loop publishes and readers (status) serve."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from vllmwatch import __version__


@dataclass(frozen=True)
class MemoryFigures:
    """The latest memory sample of the child tree with the leak-rule context."""

    source: str = "none"  # nvml-device | nvml-process | host | none
    gpu_tree_mib: float | None = None  # GPU memory used by the child tree, all GPUs
    gpu_tree_by_gpu_mib: dict[int, float] = field(default_factory=dict)
    device_used_mib: dict[int, float] = field(default_factory=dict)
    device_total_mib: dict[int, float] = field(default_factory=dict)
    host_rss_mib: float | None = None
    host_pss_mib: float | None = None
    gpu_baseline_mib: float | None = None
    host_baseline_mib: float | None = None
    gpu_slope_mib_per_h: float | None = None
    host_slope_mib_per_h: float | None = None
    gpu_rule_mib: float | None = None  # the figure the GPU rules compare with gpu_limit
    host_rule_mib: float | None = None  # the figure the host rules compare with host_limit
    # ... and where it comes from: "pss" (the last PSS reading, carried forward between PSS
    # samples) or "rss" (only while PSS was never readable for this child), and its age
    host_rule_source: str | None = None
    host_rule_age_s: float | None = None
    gpu_limit_mib: float | None = None  # memory.gpu_limit; None when off
    host_limit_mib: float | None = None  # memory.host_limit; None when off
    # A memory restart waiting for restart.quiet_hours (core/leak.py): the rule, for how
    # long, and its detail; None while none waits
    held_rule: str | None = None
    held_for_s: float | None = None
    held_detail: str | None = None


def ladder_word(phase: str, reason: object, exit_reason: object) -> str:
    """What the restart ladder's climb is, for the words beside its rung: "exit" once
    vllmwatch leaves, "restart" for a restart, "first start" for the start after the
    daemon's own (its sweep, prewarm, launch: STATUS= said "restart launching" before any
    restart); "" with no climb under way."""
    if not phase or phase == "idle":
        return ""
    return "exit" if exit_reason else "restart" if reason else "first start"


@dataclass(frozen=True)
class Snapshot:
    """Everything /status, /metrics and STATUS= show; replaced wholesale by the loop."""

    state: str = "init"
    state_since: float = 0.0  # wall-clock seconds (time.time) for humans
    state_since_monotonic: float | None = None  # same moment, monotonic: for state_for_s
    ready: bool = False
    draining: bool = False
    # The restart ladder's rung (core/restart.Phase; "idle": none under way) and since when
    # (monotonic, like state_since_monotonic: /status adds restart_phase_for_s).
    restart_phase: str = "idle"
    restart_phase_since_monotonic: float | None = None
    restart_phase_for_s: float | None = None  # at the snapshot (STATUS=, /metrics)
    # The reason of the restart the rungs belong to; None on the first start and on an exit
    # with no restart under way: neither is a restart (ladder_word)
    restart_reason: str | None = None
    child_pid: int | None = None
    child_started: float | None = None  # wall clock
    child_uptime_s: float | None = None
    restarts_by_reason: dict[str, int] = field(default_factory=dict)
    last_reason: str | None = None
    last_reason_detail: str | None = None
    last_restart_at: float | None = None  # wall clock
    # Once vllmwatch has decided to leave (core/ladder.halt): its exit code, the reason and
    # the detail (daemon.exiting's), shown until the process is gone; None while it stays.
    exit_code: int | None = None
    exit_reason: str | None = None
    exit_detail: str | None = None
    start_phases_s: dict[str, float] = field(default_factory=dict)
    # What the current (or last) launch reused of vLLM's start-up caches (core/reuse.py).
    start_reuse: dict[str, object] = field(default_factory=dict)
    memory: MemoryFigures = field(default_factory=MemoryFigures)
    vllm_running: float | None = None
    vllm_waiting: float | None = None
    vllm_kv_cache_usage: float | None = None
    probe_seconds: dict[str, float] = field(default_factory=dict)  # last duration per probe
    probe_failures: dict[str, int] = field(default_factory=dict)  # totals per probe kind
    # Wall-clock time each probe kind last completed (ok or not): the watchdog's freshness.
    probe_last_completed: dict[str, float] = field(default_factory=dict)
    model: str = ""  # the name clients use for the served model
    serving_url: str = ""  # where clients reach the model: the gate's listen, else vLLM's
    stale_probes: tuple[str, ...] = ()  # probe kinds with no result within their bound
    # Seconds since the first canary that went unanswered and was excused because vLLM's
    # counters moved (issue 37.8; None: the last one answered), and probe.busy_timeout, its
    # bound: no restart, and no probe failure counted, until then; clients may get nothing.
    canary_unanswered_s: float | None = None
    next_launch_in_s: float | None = None  # in a backoff: seconds until the next launch
    busy_timeout_s: float | None = None
    config_path: str = ""
    config_sha256: str = ""
    vllmwatch_version: str = __version__
    vllm_version: str | None = None
    drain_phase: str | None = None  # deregistering | draining | stopping, while draining
    drain_phases_s: dict[str, float] = field(default_factory=dict)  # this or the last drain
    vllm_asleep: bool | None = None  # vLLM sleep mode; None: not reported
    gate: dict[str, Any] | None = None  # the [gate] front door's counters, when enabled
    loop_heartbeat: float = 0.0  # monotonic time of the loop's last turn
    unified_memory: bool | None = None  # DGX Spark: GPU memory is system memory (None: unknown)
    platform_reason: str = ""  # why (core/unified.py decide_platform)
    # Config keys a SIGHUP changed that only a restart of vllmwatch applies (e.g. gate.*).
    restart_required: tuple[str, ...] = ()
    # Why the last SIGHUP's file was refused (the running config kept); None: it was taken
    reload_refused: str | None = None
    # How the current child was launched, and the standby for the next one (shell/launcher).
    launch: str = ""  # standby | fresh
    launches: dict[str, int] = field(default_factory=dict)
    standby_state: str = "off"  # off | importing | waiting
    standby_pid: int | None = None
    standby_rss_mib: float | None = None
    standby_reason: str = ""  # why it is off, or why the last one was discarded
    # [[adapters]] (issue 38, shell/adapters.py): live, managed rows (name, path, required,
    # rank, state loaded|missing|failed|unknown, error: vLLM's words), unmanaged names.
    adapters: dict[str, Any] | None = None
    last_incident: str | None = None  # the id of the last incident record written
    incidents_total: int = 0  # incident records written since vllmwatch started
    # Who answers the gate's clients (issue 34): full | spare | nobody; and the spare engine
    # (state, why, pid, awake/asleep MiB, failovers, last failover's seconds), None when off
    serving: str = "nobody"
    spare: dict[str, Any] | None = None
    # This start's [[smoke]] checks (core/smoke.view): name, endpoint, model, required, result
    # (passed | failed | sending | not run), seconds, error, answer (its first 300 bytes).
    smoke_checks: tuple[dict[str, Any], ...] = ()

    @property
    def restarts_total(self) -> int:
        """All restarts since vllmwatch started."""
        return sum(self.restarts_by_reason.values())

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict for /status."""
        out = asdict(self)
        out["restarts_total"] = self.restarts_total
        out["memory"]["gpu_tree_by_gpu_mib"] = {
            str(k): v for k, v in self.memory.gpu_tree_by_gpu_mib.items()}
        out["memory"]["device_used_mib"] = {
            str(k): v for k, v in self.memory.device_used_mib.items()}
        out["memory"]["device_total_mib"] = {
            str(k): v for k, v in self.memory.device_total_mib.items()}
        return out
