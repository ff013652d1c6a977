"""Plain data crossing the boundary of the pure core: events in, actions out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllmwatch.config.schema import Config, IncidentsConfig, ProbeConfig
from vllmwatch.core.hangs import HostCpu
from vllmwatch.core.names import ProbeKind, Reason
from vllmwatch.core.samples import MemorySample

if TYPE_CHECKING:  # [[smoke]]'s module is imported only when a config has checks
    from vllmwatch.config.smoke import SmokeCheck

# ---- events: what happened (the shell observed it and hands it to step()) ----


@dataclass(frozen=True)
class Tick:
    """A deadline may have passed; nothing else happened."""


@dataclass(frozen=True)
class PrewarmDone:
    """The pre-warm steps finished; ok is False only when a required step failed."""

    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class Spawned:
    """The child process started."""

    pid: int
    argv_display: str = ""
    gpu_before_mib: tuple[tuple[int, float], ...] = ()  # (GPU, MiB) before: the release gate
    launch: str = "fresh"  # fresh (Popen) | standby (a pre-imported interpreter took it)


@dataclass(frozen=True)
class SpawnFailed:
    """The child could not be started at all (e.g. executable missing, bad api key file)."""

    error: str
    fatal: bool = False  # a config error: retrying cannot help


@dataclass(frozen=True)
class ChildExited:
    """The child (the API server) exited and was reaped."""

    pid: int
    code: int | None  # exit status, or None when killed by a signal
    signal: str | None  # e.g. "SIGKILL"
    last_lines: tuple[str, ...] = ()
    # Unified memory / start-up memory diagnosis (core/unified.py): lines of the whole run
    # that look like a memory failure (the traceback may push them out of last_lines), the
    # page cache at launch as the start guard saw it, and the platform.
    memory_lines: tuple[str, ...] = ()
    page_cache_gib: float | None = None
    unified: bool = False


@dataclass(frozen=True)
class ChildOutput:
    """The child printed a line; milestone is set when it marks a start phase."""

    milestone: str | None = None
    compile_cache_hit: bool = False
    reuse: tuple[tuple[str, object], ...] = ()  # start-up cache facts (core/reuse.py)


@dataclass(frozen=True)
class HealthResult:
    """One /health probe; engine_gone when the shell saw the engine process disappear."""

    ok: bool
    status: int | None
    seconds: float
    error: str = ""
    gen: int = 0  # which child this was about; results about an older child are ignored
    engine_gone: bool = False
    # No whole answer within probe.timeout (a trickling or silent server): a failure even
    # while starting, where a refused connection only means "not listening yet".
    timed_out: bool = False


@dataclass(frozen=True)
class CanaryResult:
    """One real completion (the canary) or the warm-up request."""

    ok: bool
    timed_out: bool
    seconds: float
    error: str = ""
    warmup: bool = False
    gen: int = 0
    kind: str | None = None  # the canary kind `auto` found with this request, else None


@dataclass(frozen=True)
class MetricsResult:
    """The few /metrics series the policies need; ok False when the scrape failed."""

    ok: bool
    seconds: float = 0.0
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    error: str = ""
    gen: int = 0
    asleep: bool | None = None  # vLLM sleep mode (core/sleep.py); None: not reported
    host_cpu: HostCpu | None = None  # the host's CPU pressure at the scrape (core/hangs.py)


@dataclass(frozen=True)
class MemorySampled:
    """A memory sample of the child tree (see memory.MemorySample)."""

    sample: MemorySample | None  # None when the sampler failed (see error)
    minute_of_day: int = 0  # local time, for quiet hours
    gen: int = 0
    error: str = ""


@dataclass(frozen=True)
class SweepDone:
    """The old tree is gone (or not) and the port is free (or held)."""

    killed: tuple[int, ...]
    remaining: tuple[int, ...]
    port_holder: str | None  # "pid 123 (nginx)" when a foreign process holds the port
    foreign_vllm: tuple[str, ...] = ()  # vLLM-looking processes that are not ours
    error: str = ""  # the sweep itself failed: what is left is unknown
    killed_what: tuple[str, ...] = ()  # "pid N (cmdline)" of each killed, for the log


@dataclass(frozen=True)
class ReleaseChecked:
    """A look at the GPUs after a stop: has the old tree's memory been given back?"""

    released: bool
    detail: str


@dataclass(frozen=True)
class StopRequested:
    """SIGTERM or SIGINT to vllmwatch."""

    signal: str


@dataclass(frozen=True)
class RestartRequested:
    """SIGUSR1: a graceful restart now."""


@dataclass(frozen=True)
class ReadyzPolled:
    """Someone (a load balancer) polled /readyz; polled=False only says the shell reports
    polls from now on, so that no poll at all means nobody deregisters us."""

    polled: bool = True


@dataclass(frozen=True)
class ReloadRequested:
    """SIGHUP: the shell re-read the config; config is None when it was invalid."""

    config: Config | None
    error: str = ""


@dataclass(frozen=True)
class IncidentRecorded:
    """The incident record asked for by RecordIncident is written (path) or failed (error)."""

    seq: int  # RecordIncident.seq: an answer to an earlier request is ignored
    incident_id: str = ""
    path: str = ""
    error: str = ""
    seconds: float = 0.0
    stacks: str = ""  # which stack methods ran, in a few words (for the log)


@dataclass(frozen=True)
class SmokeResult:
    """The answer to a Smoke action (core/smoke.py): ok, or why not and how it began."""

    index: int  # Smoke.index
    ok: bool
    seconds: float
    error: str = ""  # what was wrong: status, vLLM's own error message, the missing field
    answer: str = ""  # the answer's first bytes, through the one redactor (config/redact.py)
    gen: int = 0


@dataclass(frozen=True)
class SpareEvent:
    """What the spare engine did: core/failover.py's (imported only when it is on)."""


Event = (Tick | PrewarmDone | Spawned | SpawnFailed | ChildExited | ChildOutput | HealthResult
         | CanaryResult | MetricsResult | MemorySampled | SweepDone | ReleaseChecked
         | StopRequested | RestartRequested | ReloadRequested | ReadyzPolled | IncidentRecorded
         | SmokeResult | SpareEvent)

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
    """Send a signal to the child's whole process group."""

    signal: str  # "SIGTERM" | "SIGKILL"


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


@dataclass(frozen=True)
class Sweep:
    """Kill what is left of our old tree (group and marked processes) and look at the port."""

    pgid: int | None
    host: str
    port: int
    kill_stale: bool = True  # with no pgid: kill leftovers of ours found by marker/session
    settle: float = 0.0  # seconds to let a tree we asked to stop finish exiting by itself


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
