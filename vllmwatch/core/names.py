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

from vllmwatch.core import exitcodes


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
    engine is known to be stuck, so the SIGTERM grace is short; `exit_code` the code the
    daemon leaves with for it (through `halt` in core/ladder.py), None when it never ends
    the daemon. The numbers themselves live only in core/exitcodes.py."""

    restart: bool
    failure: bool
    stuck: bool
    exit_code: int | None
    meaning: str

    @property
    def exits(self) -> bool:
        """It can end the daemon."""
        return self.exit_code is not None


_R = Reason
_X = exitcodes
REASONS: dict[Reason, ReasonInfo] = {
    _R.CRASH: ReasonInfo(True, True, False, None, "the child exited unasked, or could not be "
                         "launched"),
    _R.HEALTH: ReasonInfo(True, True, False, None, "/health or the canary failed "
                          "probe.failure_threshold times"),
    _R.ENGINE_DIED: ReasonInfo(True, True, False, None, "an engine process (EngineCore, a "
                               "TP worker) died: its signal or exit code is in the detail"),
    _R.HANG: ReasonInfo(True, True, True, None, "the canary timed out while the engine made "
                        "no progress"),
    _R.STALL: ReasonInfo(True, True, True, None, "requests wait and none runs for "
                         "probe.stall_timeout"),
    _R.START_TIMEOUT: ReasonInfo(True, True, False, None, "not READY within startup.timeout"),
    _R.START_STALL: ReasonInfo(True, True, False, None, "no output and no progress during "
                               "start for startup.stall_timeout"),
    _R.GPU_MEMORY: ReasonInfo(True, True, False, None, "a GPU memory rule held (limit, "
                              "growth, rate)"),
    _R.HOST_MEMORY: ReasonInfo(True, True, False, None, "a host memory rule held"),
    _R.START_MEMORY: ReasonInfo(True, True, False, _X.START_MEMORY, "the start died for "
                                "memory; after memory.start_memory_retries in a row the "
                                "daemon exits"),
    _R.MANUAL: ReasonInfo(True, False, False, None, "SIGUSR1: a person asked for a graceful "
                          "restart"),
    _R.RELOAD: ReasonInfo(True, False, False, None, "SIGHUP changed the vLLM command or "
                          "environment"),
    _R.GPU_FAULT: ReasonInfo(False, False, False, _X.GPU_FAULT, "a GPU hardware fault a "
                             "restart cannot fix"),
    _R.STOP: ReasonInfo(False, False, False, _X.OK, "SIGTERM/SIGINT: stop on request"),
    _R.CRASHLOOP: ReasonInfo(False, False, False, _X.GAVE_UP, "too many failure restarts in "
                             "restart.window"),
    _R.CONFIG: ReasonInfo(False, False, False, _X.CONFIG, "vLLM refused its arguments during "
                          "start, or cannot be launched at all (a [vllm] that never reached "
                          "READY in this daemon's life: core/launchfail.py)"),
    _R.PORT_BUSY: ReasonInfo(False, False, False, _X.START, "a foreign process holds "
                             "vllm.port, or [gate] cannot bind gate.listen"),
    _R.PREWARM_FAILED: ReasonInfo(False, False, False, _X.FAILURE, "a required pre-warm step "
                                  "failed"),
    _R.INTERNAL: ReasonInfo(False, False, False, _X.INTERNAL, "an unexpected error inside "
                            "vllmwatch; the shell kills the tree"),
    _R.ALREADY_RUNNING: ReasonInfo(False, False, False, _X.ALREADY_RUNNING, "another live "
                                   "vllmwatch holds this config's instance lock; nothing "
                                   "touched"),
}

# Restarts that mean something went wrong: they feed backoff and the crash-loop guard.
FAILURE_REASONS = frozenset(r for r, i in REASONS.items() if i.failure)
# The engine is stuck: its API server ignores SIGTERM, so the full grace only adds downtime.
STUCK_REASONS = frozenset(r for r, i in REASONS.items() if i.stuck)
RESTART_REASONS = tuple(r for r, i in REASONS.items() if i.restart)
EXIT_REASONS = tuple(r for r, i in REASONS.items() if i.exits)


def exit_code(reason: Reason) -> int:
    """The code the daemon leaves with for `reason` (a bug for a reason that never exits)."""
    code = REASONS[reason].exit_code
    assert code is not None, f"{reason} never ends the daemon"
    return code


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
