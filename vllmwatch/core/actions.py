"""Plain data leaving the pure core: the actions step() answers with (what the shell is to
do), and failure_result, the one result event that stands for an effect whose worker raised.

Split from core/events.py (issue 32): the events come in, the actions go out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllmwatch.config.schema import Config, IncidentsConfig, ProbeConfig
from vllmwatch.core.events import (
    CanaryResult,
    Event,
    HealthResult,
    IncidentRecorded,
    MemorySampled,
    MetricsResult,
    PrewarmDone,
    ReleaseChecked,
    SmokeResult,
    SweepDone,
)
from vllmwatch.core.names import ProbeKind, Reason

if TYPE_CHECKING:  # [[smoke]]'s module is imported only when a config has checks
    from vllmwatch.config.smoke import SmokeCheck

# ---- actions: what to do (the shell executes them) ----


@dataclass(frozen=True)
class Log:
    """Emit an event to the log."""

    level: str  # debug | info | warning | error
    event: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Notify:
    """Tell systemd something (sd_notify)."""

    ready: bool = False
    stopping: bool = False
    reloading: bool = False
    extend_usec: int | None = None


@dataclass(frozen=True)
class DoPrewarm:
    """Run the pre-warm steps for this config."""

    config: Config


@dataclass(frozen=True)
class Spawn:
    """Start the child with this config.

    The one synchronous action: the shell answers it (Spawned or SpawnFailed) before any other
    event is stepped, so the core never sees a launch that is out but unanswered.
    """

    config: Config


@dataclass(frozen=True)
class SignalGroup:
    """Send a signal to the child's whole process group, or with `leader` to its leader alone
    (the API server, which passes a SIGTERM on to its engine once it has drained it)."""

    signal: str  # "SIGTERM" | "SIGKILL"
    leader: bool = False


@dataclass(frozen=True)
class KillEngines:
    """SIGKILL the child's engine processes (EngineCore, workers), not its API server.

    For a stuck engine (issue 24, measured on the CPU vLLM): with its engine gone the API
    server answers the requests in flight with HTTP 500 within ~0.1 s and exits 0 ~1.5 s
    later, where a SIGTERM to the group left them to a connection reset at the SIGKILL. With
    no engine process found the shell sends SIGTERM to the group."""


@dataclass(frozen=True)
class StopSending:
    """The gate (when on) sends nothing more to the child's engine and ends its requests in
    flight now: vllmwatch declared the engine stuck, so nothing there can finish. Those whose
    answer had not begun wait for the next engine and are sent once more (issue 35); taken at
    the verdict, before the incident record (which counts them) and the take-down, instead of
    leaving them at the stuck engine until it is killed."""


@dataclass(frozen=True)
class Probe:
    """Start a probe in the background: health, canary, warmup or metrics.

    It names where the child listens (the child's own [vllm], which a reload does not move)
    and the probe settings in force now.
    """

    kind: ProbeKind  # an http kind of names.PROBES
    gen: int
    host: str
    port: int
    model_name: str
    probe: ProbeConfig
    canary_kind: str | None = None  # what `auto` found for this child (ChildRun.canary_kind)


@dataclass(frozen=True)
class Smoke:
    """Send one smoke check to the child where it listens (shell/smoke.py), in the
    background, with the probes' deadline and byte cap; answered by one SmokeResult."""

    index: int  # which check of the start's (core/smoke.SmokeRun.checks)
    check: SmokeCheck
    gen: int
    host: str
    port: int
    model_name: str  # the check's model, else the served model name
    timeout: float  # for the whole request


@dataclass(frozen=True)
class SampleMemory:
    """Sample the memory of the child tree."""

    with_pss: bool
    gen: int = 0
    gpus: tuple[int, ...] | None = None  # the child's GPUs; None = every GPU
    # (GPU, MiB) in use before the child's launch: is NVML blind to it? (shell/gpufaults.py)
    before_launch: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Sweep:
    """Kill what is left of our old tree (group and marked processes) and look at the port."""

    pgid: int | None
    host: str
    port: int
    kill_stale: bool = True  # with no pgid: kill leftovers of ours found by marker/session
    settle: float = 0.0  # seconds to let a tree we asked to stop finish exiting by itself
    # The leader alone got the SIGTERM and exited: what is left of its group gets it (the tops
    # of it: a wrapper's vLLM) and this many seconds to drain before the SIGKILL
    pass_on: float = 0.0


@dataclass(frozen=True)
class CheckRelease:
    """Look whether the GPUs gave back the old tree's memory."""

    old_pids: tuple[int, ...]
    tolerance_mib: float
    before_launch: tuple[tuple[int, float], ...] = ()  # (GPU, MiB) before the old launch


@dataclass(frozen=True)
class StartOver:
    """The start is over (READY, or left): the shell stops the unified-memory start guard."""

    why: str


@dataclass(frozen=True)
class RecordIncident:
    """Write an incident record of the child tree before it is taken down (vllmwatch/incident).

    The shell answers IncidentRecorded within `timeout` seconds (its dumpers are killed at the
    deadline); the ladder waits for that answer, or `timeout` + a margin, then goes on.
    `facts` is what the core knows, JSON-ready: phases, restart counts, memory samples;
    `config` the [incidents] settings in force now (the core's, issue 32 item 5).
    """

    seq: int
    reason: Reason
    detail: str
    timeout: float
    pgid: int | None  # the child's group: its processes may outlive the API server
    exit_code: int | None = None  # set when vllmwatch leaves after this (names.REASONS)
    facts: dict[str, Any] = field(default_factory=dict)
    config: IncidentsConfig = field(default_factory=IncidentsConfig)


@dataclass(frozen=True)
class Exit:
    """Leave the loop with this exit code."""

    code: int


@dataclass(frozen=True)
class UpdateAdapters:
    """[lora] live = true: load and unload LoRA adapters in the running vLLM (core/lora.py);
    the shell sends them off the loop and reports what vLLM said (shell/adapters.py)."""

    load: tuple[Any, ...] = ()  # config.sections.AdapterConfig: added and repointed
    unload: tuple[str, ...] = ()
    inplace: tuple[str, ...] = ()  # repointed: loaded again in place under the same name
    config: Config | None = None  # the reload's config, which the core took (issue 32 item 5)


@dataclass(frozen=True)
class SpareAction:
    """An action for the spare engine: core/failover.py's (imported only when it is on)."""


Action = (Log | Notify | DoPrewarm | Spawn | SignalGroup | KillEngines | StopSending | Probe
          | SampleMemory | Sweep | CheckRelease | StartOver | RecordIncident | Exit | Smoke
          | SpareAction | UpdateAdapters)
AsyncAction = Probe | SampleMemory | Sweep | CheckRelease | DoPrewarm | RecordIncident | Smoke


def failure_result(action: AsyncAction, error: str) -> Event:
    """The result event that stands for a worker that raised: every effect the loop submits
    posts exactly one result, so no probe stays marked in flight for good. A failed probe
    counts as that probe failing; a failed sweep leaves what remains unknown."""
    if isinstance(action, Probe):
        if action.kind == ProbeKind.HEALTH:
            return HealthResult(False, None, 0.0, error, gen=action.gen)
        if action.kind == ProbeKind.METRICS:
            return MetricsResult(False, error=error, gen=action.gen)
        return CanaryResult(False, False, 0.0, error, warmup=action.kind == ProbeKind.WARMUP,
                            gen=action.gen)
    if isinstance(action, SampleMemory):
        return MemorySampled(None, gen=action.gen, error=error)
    if isinstance(action, Sweep):
        return SweepDone((), (), None, error=error)
    if isinstance(action, CheckRelease):
        return ReleaseChecked(False, f"the GPU check failed: {error}")
    if isinstance(action, RecordIncident):
        return IncidentRecorded(action.seq, error=error)
    if isinstance(action, Smoke):
        return SmokeResult(action.index, False, 0.0, error, gen=action.gen)
    return PrewarmDone(not action.config.prewarm.required, f"pre-warm crashed: {error}")
