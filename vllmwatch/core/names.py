"""The core's typed names: why the child is taken down (`Reason`) and what is asked of it
(`ProbeKind`), each with one table of what every member means.

Both are str-valued (`class X(str, Enum)`, as core/state.State: the project supports
Python 3.10, which has no StrEnum), so a member still equals its string in logs, /status
JSON and tests. Adding a member means adding its row here; the sets the rest of the code
uses (FAILURE_REASONS, STUCK_REASONS, GUARDED_PROBES, the metrics label sets) follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Reason(str, Enum):
    """Why vLLM is taken down: for a restart, or for the daemon's exit (see REASONS)."""

    CRASH = "crash"
    HEALTH = "health"
    ENGINE_DIED = "engine_died"
    HANG = "hang"
    STALL = "stall"
    START_TIMEOUT = "start_timeout"
    START_STALL = "start_stall"
    GPU_MEMORY = "gpu_memory"
    HOST_MEMORY = "host_memory"
    START_MEMORY = "start_memory"
    MANUAL = "manual"
    RELOAD = "reload"
    GPU_FAULT = "gpu_fault"
    STOP = "stop"
    CRASHLOOP = "crashloop"
    CONFIG = "config"
    PORT_BUSY = "port_busy"
    PREWARM_FAILED = "prewarm_failed"
    INTERNAL = "internal"
    ALREADY_RUNNING = "already_running"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ReasonInfo:
    """One row: `restart` the reason can start a restart (it is a `restarts_by_reason` label);
    `failure` it feeds backoff and the crash-loop guard (planned when False); `stuck` the
    engine is known to be stuck, so the SIGTERM grace is short; `exits` it can end the
    daemon (through core/halt.py)."""

    restart: bool
    failure: bool
    stuck: bool
    exits: bool
    meaning: str


_R = Reason
REASONS: dict[Reason, ReasonInfo] = {
    _R.CRASH: ReasonInfo(True, True, False, False, "the child exited unasked, or could not "
                         "be launched"),
    _R.HEALTH: ReasonInfo(True, True, False, False, "/health or the canary failed "
                          "probe.failure_threshold times"),
    _R.ENGINE_DIED: ReasonInfo(True, True, False, False, "an engine process (EngineCore, a "
                               "TP worker) died: its signal or exit code is in the detail"),
    _R.HANG: ReasonInfo(True, True, True, False, "the canary timed out while the engine made "
                        "no progress"),
    _R.STALL: ReasonInfo(True, True, True, False, "requests wait and none runs for "
                         "probe.stall_timeout"),
    _R.START_TIMEOUT: ReasonInfo(True, True, False, False, "not READY within startup.timeout"),
    _R.START_STALL: ReasonInfo(True, True, False, False, "no output and no progress during "
                               "start for startup.stall_timeout"),
    _R.GPU_MEMORY: ReasonInfo(True, True, False, False, "a GPU memory rule held (limit, "
                              "growth, rate)"),
    _R.HOST_MEMORY: ReasonInfo(True, True, False, False, "a host memory rule held"),
    _R.START_MEMORY: ReasonInfo(True, True, False, True, "the start died for memory; after "
                                "memory.start_memory_retries in a row the daemon exits 5"),
    _R.MANUAL: ReasonInfo(True, False, False, False, "SIGUSR1 (`vllmwatch restart`)"),
    _R.RELOAD: ReasonInfo(True, False, False, False, "SIGHUP changed the vLLM command or "
                          "environment"),
    _R.GPU_FAULT: ReasonInfo(False, False, False, True, "a GPU hardware fault a restart "
                             "cannot fix: exit 6"),
    _R.STOP: ReasonInfo(False, False, False, True, "SIGTERM/SIGINT: stop on request, exit 0"),
    _R.CRASHLOOP: ReasonInfo(False, False, False, True, "too many failure restarts in "
                             "restart.window: exit 3"),
    _R.CONFIG: ReasonInfo(False, False, False, True, "vLLM refused its arguments during "
                          "start, or cannot be launched at all: exit 2"),
    _R.PORT_BUSY: ReasonInfo(False, False, False, True, "a foreign process holds vllm.port: "
                             "exit 4"),
    _R.PREWARM_FAILED: ReasonInfo(False, False, False, True, "a required pre-warm step "
                                  "failed: exit 1"),
    _R.INTERNAL: ReasonInfo(False, False, False, True, "an unexpected error inside "
                            "vllmwatch; the shell kills the tree: exit 70"),
    _R.ALREADY_RUNNING: ReasonInfo(False, False, False, True, "another live vllmwatch holds "
                                   "this config's instance lock: exit 7, nothing touched"),
}

# Restarts that mean something went wrong: they feed backoff and the crash-loop guard.
FAILURE_REASONS = frozenset(r for r, i in REASONS.items() if i.failure)
# The engine is stuck: its API server ignores SIGTERM, so the full grace only adds downtime.
STUCK_REASONS = frozenset(r for r, i in REASONS.items() if i.stuck)
RESTART_REASONS = tuple(r for r, i in REASONS.items() if i.restart)
EXIT_REASONS = tuple(r for r, i in REASONS.items() if i.exits)


class ProbeKind(str, Enum):
    """What the core asks of the child (a Probe or SampleMemory action), and timer names."""

    HEALTH = "health"
    CANARY = "canary"
    WARMUP = "warmup"
    METRICS = "metrics"
    MEMORY = "memory"
    PSS = "pss"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ProbeInfo:
    """One row: `http` a Probe action against vLLM's HTTP API; `guarded` the freshness guard
    watches it while READY (core/probing.bounds); `timer_only` a timer that starts nothing
    itself."""

    http: bool
    guarded: bool
    timer_only: bool
    meaning: str


_P = ProbeKind
PROBES: dict[ProbeKind, ProbeInfo] = {
    _P.HEALTH: ProbeInfo(True, True, False, "GET /health; every probe.interval once READY"),
    _P.CANARY: ProbeInfo(True, True, False, "a one-token request; proves the engine answers"),
    _P.WARMUP: ProbeInfo(True, False, False, "the canary before READY (startup.warmup)"),
    _P.METRICS: ProbeInfo(True, True, False, "GET /metrics: queue, KV cache, progress"),
    _P.MEMORY: ProbeInfo(False, True, False, "a memory sample of the child tree (NVML, RSS)"),
    _P.PSS: ProbeInfo(False, False, True, "when the next memory sample also reads PSS"),
}
GUARDED_PROBES = tuple(k for k, i in PROBES.items() if i.guarded)
