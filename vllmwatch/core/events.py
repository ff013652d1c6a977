"""Plain data crossing into the pure core: the events step() is given (what the shell saw).

The actions step() answers with (what the shell is to do) are core/actions.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllmwatch.config.schema import Config
from vllmwatch.core.hangs import HostCpu
from vllmwatch.core.samples import MemorySample

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
    inputs: tuple[tuple[str, str], ...] = ()  # config/command.file_inputs of this launch


@dataclass(frozen=True)
class SpawnFailed:
    """The child could not be started at all (e.g. executable missing, bad api key file)."""

    error: str
    fatal: bool = False  # a config error: retrying cannot help
    called_off: bool = False  # a stop came while the launch waited: nothing ran, none fails


@dataclass(frozen=True)
class LaunchWaits:
    """The shell's answer to a Spawn that must first wait for something bounded: a stopped
    spare's tree gone (its GPU memory), the vLLM version read. Nothing was launched; the core
    waits on the rung launch_wait (core/stopping.launch_waits), answering every signal, and
    LaunchMayGo follows."""

    detail: str = ""


@dataclass(frozen=True)
class LaunchMayGo:
    """What a launch waited for is there (LaunchWaits): it may go."""


@dataclass(frozen=True)
class ChildExited:
    """The child (the API server) exited and was reaped."""

    pid: int
    code: int | None  # exit status, or None when killed by a signal
    signal: str | None  # e.g. "SIGKILL"
    last_lines: tuple[str, ...] = ()
    # Unified memory / start-up memory diagnosis (core/unified.py): lines of the whole run
    # that look like a memory failure or a full disk (reuse.disk_full) (the traceback may
    # push them out of last_lines), the page cache at launch as the start guard saw it, and
    # the platform.
    memory_lines: tuple[str, ...] = ()
    page_cache_gib: float | None = None
    unified: bool = False
    # The engine processes (EngineCore, TP workers) seen under it known to have failed by the
    # reap (shell/engines.py EngineWatch.failed), as it says it: `pid 812 (VLLM::EngineCore)
    # killed by SIGKILL (the OOM killer? see the incident record)`.
    engines_gone: tuple[str, ...] = ()
    # What vLLM said when a SIGTERM or SIGINT started its shutdown (incident/cause.py
    # TOLD_TO_STOP), "" when it did not: vLLM logs it on a signal only, never on an engine's
    # death, so an unasked exit after it was someone else's stop, whatever its engines did.
    told_to_stop: str = ""


@dataclass(frozen=True)
class ChildOutput:
    """The child printed a line; milestone is set when it marks a start phase."""

    milestone: str | None = None
    compile_cache_hit: bool = False
    reuse: tuple[tuple[str, object], ...] = ()  # start-up cache facts (core/reuse.py)
    told_to_stop: str = ""  # vLLM's words: a signal started its shutdown (incident/cause.py)
    pid: int = 0  # the child that printed it (told_to_stop's only: a late line of an old one)


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
    asleep: bool | None = None  # vLLM sleep mode (core/hangs.py); None: not reported
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
    seen: tuple[int, ...] = ()  # every pid of our tree it found, killed or gone meanwhile


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
    # With the spare on: what a spare built from `config` now would run (core/failover.py's
    # Inputs, read by the same worker: the key file's contents are no part of the config)
    spare_inputs: tuple[tuple[str, str], ...] = ()
    # config/command.file_inputs for `config` now (the key file, vllm.env_file); () unknown
    serving_inputs: tuple[tuple[str, str], ...] = ()


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


Event = (Tick | PrewarmDone | Spawned | SpawnFailed | LaunchWaits | LaunchMayGo | ChildExited
         | ChildOutput | HealthResult | CanaryResult | MetricsResult | MemorySampled | SweepDone
         | ReleaseChecked | StopRequested | RestartRequested | ReloadRequested | ReadyzPolled
         | IncidentRecorded | SmokeResult | SpareEvent)
