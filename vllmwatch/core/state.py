"""The supervisor's named states, the one table of allowed transitions, and its state record."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING

from vllmwatch.config.schema import Config, VllmConfig
from vllmwatch.core.actions import Action, Log, StartOver
from vllmwatch.core.drain import Drain
from vllmwatch.core.leak import LeakState, Waiting
from vllmwatch.core.names import ProbeKind, Reason, exit_code
from vllmwatch.core.policy import Progress
from vllmwatch.core.restart import Restart
from vllmwatch.core.samples import HostFigure, MemorySample

if TYPE_CHECKING:
    from vllmwatch.config.smoke import SmokeCheck  # only when a config has [[smoke]]
    from vllmwatch.core.exitcodes import Unit
    from vllmwatch.core.failover import Track  # imported by a run only when the spare is on


class State(str, Enum):
    """Where the supervisor is; the value is what logs, STATUS and /status show."""

    INIT = "init"
    PREWARMING = "prewarming"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    CLEANUP = "cleanup"
    BACKOFF = "backoff"
    STOPPED = "stopped"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


S = State
TRANSITIONS: dict[State, frozenset[State]] = {
    S.INIT: frozenset({S.CLEANUP}),
    S.CLEANUP: frozenset({S.PREWARMING, S.STARTING, S.BACKOFF, S.STOPPED, S.FAILED}),
    S.PREWARMING: frozenset({S.STARTING, S.CLEANUP, S.FAILED}),
    S.STARTING: frozenset({S.READY, S.STOPPING, S.CLEANUP, S.BACKOFF}),  # (stopping.launch_waits)
    S.READY: frozenset({S.DRAINING, S.STOPPING, S.CLEANUP}),
    S.DRAINING: frozenset({S.STOPPING, S.CLEANUP}),
    S.STOPPING: frozenset({S.CLEANUP}),
    S.BACKOFF: frozenset({S.STARTING, S.CLEANUP}),
    S.STOPPED: frozenset(),
    S.FAILED: frozenset(),
}
FINAL = frozenset({S.STOPPED, S.FAILED})
CHILD_STATES = frozenset({S.STARTING, S.READY, S.DRAINING, S.STOPPING})


class TransitionError(RuntimeError):
    """A bug: the core asked for a transition the table does not allow."""


# ChildRun's sub-records (issue 32 item 4). Each is written by exactly one module, the one
# that owns its concern (named in its docstring); any module may read any of them.
# tests/core/test_childrun_owners.py fails when another module writes one.


@dataclass(frozen=True)
class SmokeOutcome:
    """One smoke check's verdict in this start (core/smoke.py)."""

    name: str
    endpoint: str
    model: str
    ok: bool
    required: bool
    seconds: float = 0.0
    error: str = ""
    answer: str = ""  # the answer's first ANSWER_BYTES, redacted by the shell


@dataclass(frozen=True)
class SmokeRun:
    """The checks of one start: fixed when the first is sent (a SIGHUP changes the next
    start's), their outcomes in order, and `held` once a required one failed. Owner:
    core/smoke.py."""

    checks: tuple[SmokeCheck, ...]
    outcomes: tuple[SmokeOutcome, ...] = ()
    held: str = ""  # why READY is held: the failed required check, its error and answer

    @property
    def next(self) -> int | None:
        """The index of the check to send (or in flight); None when none is left to send."""
        n = len(self.outcomes)
        return None if self.held or n >= len(self.checks) else n


@dataclass(frozen=True)
class Proc:
    """The child's process: launched (Spawned), exited, swept. Owner: core/stopping.py."""

    pid: int | None = None
    pgid: int | None = None
    spawned: bool = False  # the shell confirmed the launch (Spawned)
    exited_pid: int | None = None  # the pid it had once it exited: the gate's generation key
    gpu_before_mib: tuple[tuple[int, float], ...] = ()  # GPU use before launch (release gate)
    inputs: tuple[tuple[str, str], ...] = ()  # what it read beyond the config (Spawned.inputs)
    group_term_at: float | None = None  # a drained stop SIGTERMs its whole group then (stopping)
    drain_until: float | None = None  # a drained stop's window, while the SIGTERM went to the
    # leader alone: what outlives the leader (a wrapper's vLLM) gets it and this long (stopping)


@dataclass(frozen=True)
class Start:
    """The start: progress, phases, what it reused, when it became READY. Owner:
    core/serving.py."""

    last_progress: float = 0.0  # last child output line during start
    # (time, tree CPU s) of the first and the latest memory sample since last_progress
    cpu_since_progress: tuple[tuple[float, float], tuple[float, float]] | None = None
    last_milestone_at: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    compile_cache_hit: bool = False
    reuse: dict[str, object] = field(default_factory=dict)  # core/reuse.py: what it reused
    inputs: dict[str, str] = field(default_factory=dict)  # reuse.inputs of the launch's config
    ready_at: float | None = None
    health_said: str = ""  # the last /health answer that was not 200 ('' after a 200)
    canary_said: str = ""  # why the last canary of the start failed (a start timeout says it)


@dataclass(frozen=True)
class Probes:
    """The probes' bookkeeping: in flight, when due, when last landed, which are overdue, and
    the last memory sample. Owner: core/probing.py."""

    inflight: frozenset[ProbeKind] = frozenset()
    timers: dict[ProbeKind, float] = field(default_factory=dict)  # kind -> next due time
    done_at: dict[ProbeKind, float] = field(default_factory=dict)  # kind -> last result
    stale: tuple[ProbeKind, ...] = ()  # probe kinds whose results are overdue
    memory: MemorySample | None = None  # the last memory sample


@dataclass(frozen=True)
class Engine:
    """What the engine's answers say: failure streaks, /metrics gauges, progress, stalls.
    Owner: core/serving.py."""

    health_failures: int = 0  # consecutive /health failures; only /health 200 resets it
    canary_failures: int = 0  # consecutive canary errors (not timeouts); only a canary resets
    engine_gone: bool = False  # an engine or worker process of this child is gone
    progress: Progress | None = None
    stall_since: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    asleep: bool | None = None  # vLLM sleep mode, from the last scrape (core/hangs.py)


@dataclass(frozen=True)
class Memory:
    """The memory rules' view once READY. Owner: core/serving.py."""

    leak: LeakState | None = None  # the leak rules' state once READY
    host: HostFigure | None = None  # the host rules' figure (core/samples.host_figure)
    # (time, GPU rule MiB, host rule MiB) of the newest samples the leak rules judged: an
    # incident record of a memory restart shows what made the rule fire (core/incidents.py)
    recent: tuple[tuple[float, float | None, float | None], ...] = ()
    waiting: Waiting = field(default_factory=Waiting)  # a restart held for the quiet hours


@dataclass(frozen=True)
class Canary:
    """Issue 24 (core/hangs.py): this run's canary latencies, the canary in flight, the retry,
    the hang suspicion and the verdicts. Owner: core/hangverdicts.py."""

    kind: str | None = None  # the kind `auto` found (CanaryResult.kind), for the next
    seconds: tuple[float, ...] = ()  # successful canaries, the last hangs.HISTORY
    ref: Progress | None = None  # progress when the canary in flight was sent
    asleep: bool | None = None  # vLLM's sleep mode when the canary in flight was sent
    sent_at: float | None = None
    timeout_s: float | None = None  # the timeout the canary in flight was sent with
    is_retry: bool = False  # ... and whether it was the longer retry of a timeout
    retry_s: float | None = None  # the next canary is a retry with this timeout
    suspect: bool = False  # a canary timed out; a scrape decides busy or hung
    busy_since: float | None = None  # sent-time of the first canary excused as busy (37.8)
    # The canary verdicts of this run (time, what): an incident's timeline shows them
    verdicts: tuple[tuple[float, str], ...] = ()
    frozen_since: float | None = None  # work queued and no series moved since (policy)


@dataclass(frozen=True)
class ChildRun:
    """One child generation: created whole at spawn (core/ladder.py), never patched field by
    field across runs; each sub-record has one owner module (above).

    `proc.pid` is None between the Spawn action and its Spawned result, and again once the
    child exited; `vllm` is the [vllm] section it was launched with (a SIGHUP may change the
    config's, but this child keeps listening where it was started).
    """

    gen: int
    started: float
    vllm: VllmConfig
    proc: Proc = field(default_factory=Proc)
    start: Start = field(default_factory=Start)
    probes: Probes = field(default_factory=Probes)
    engine: Engine = field(default_factory=Engine)
    mem: Memory = field(default_factory=Memory)
    canary: Canary = field(default_factory=Canary)
    drain: Drain | None = None  # the drain before a planned restart (core/drain.py); owner:
    # core/stopping.py
    smoke: SmokeRun | None = None  # this start's smoke checks, once the canary passed; owner:
    # core/smoke.py

    @property
    def pid(self) -> int | None:
        """The live child's pid, if any (proc.pid)."""
        return self.proc.pid


@dataclass(frozen=True)
class WatchState:
    """Everything the pure core knows for the daemon's lifetime. Replaced, never mutated."""

    config: Config
    state: State = S.INIT
    since: float = 0.0
    deadline: float | None = None  # the current state's time limit
    gen: int = 0  # child generations launched; results about older children are dropped
    child: ChildRun | None = None  # the current (or last) child generation
    ever_ready: bool = False
    # The [vllm] section of the last launch that reached READY (goto): a launch of it that
    # fails the config's way is a passing failure, not exit 78 (core/launchfail.py)
    proven: VllmConfig | None = None
    prewarmed: bool = False
    exit_reason: Reason | None = None  # set when vllmwatch is leaving: only ladder.halt
    exit_detail: str = ""
    # Why the last SIGHUP's file was refused ("": the last was taken, or none came): systemd
    # hears READY=1 after RELOADING=1 either way, so STATUS= and /status must say it
    reload_refused: str = ""
    restart: Restart = field(default_factory=Restart)  # the restart ladder's rung (core/restart.py)
    old_pids: tuple[int, ...] = ()  # the old tree's pids, from the sweep to the release gate
    failures: int = 0  # consecutive failures, for backoff
    restart_times: tuple[float, ...] = ()
    restarts_by_reason: dict[Reason, int] = field(default_factory=dict)
    last_reason: Reason | None = None
    last_detail: str | None = None
    last_restart_at: float | None = None
    # The outage under way: (when its first restart began, that restart's reason, restarts
    # so far); a relaunch that fails before READY is part of it (core/policy.outage_done).
    outage: tuple[float, Reason, int] | None = None
    probe_seconds: dict[ProbeKind, float] = field(default_factory=dict)
    probe_failures: dict[ProbeKind, int] = field(default_factory=dict)
    last_drain: dict[str, float] = field(default_factory=dict)  # phase -> s, last drain
    next_extend: float = 0.0
    rng: int = 0x2545F4914F6CDD1D
    last_hits: dict[str, bool] = field(default_factory=dict)  # caches the last READY hit
    last_inputs: dict[str, str] = field(default_factory=dict)  # ... its config (reuse.inputs)
    memory_failures: tuple[int, int] = (0, 0)  # (starts failed for memory in a row, last gen)
    # Who watches /readyz (issue 28): only a balancer polling it needs the deregister delay.
    readyz_tracked: bool = False  # the shell reports /readyz polls (else: always deregister)
    readyz_seen_at: float | None = None  # the last /readyz poll it reported
    incident_seq: int = 0  # incident records asked for
    incidents_total: int = 0  # incident records written
    last_incident: str | None = None  # the id of the last one written
    spare: Track | None = None  # the spare engine's track (core/failover.py); None: no spare
    # The systemd unit the daemon runs as ("vllmwatch@gpu1", its manager's: the shell reads
    # its cgroup), so that a hint's commands name it; None: no service (the instance's form)
    unit: Unit | None = None

    @property
    def run(self) -> ChildRun:
        """The current child record, for `replace(s, child=replace(s.run, ...))`: a bug when
        there is none."""
        assert self.child is not None, "no child record"
        return self.child

    @property
    def exit_code(self) -> int | None:
        """The code vllmwatch leaves with, once it is leaving: its reason's (core/names.py)."""
        return None if self.exit_reason is None else exit_code(self.exit_reason)

    @property
    def pid(self) -> int | None:
        """The live child's pid, if any."""
        return self.child.proc.pid if self.child is not None else None


Result = tuple[WatchState, list[Action]]  # what every core function returns


def goto(s: WatchState, to: State, now: float, reason: str, deadline: float | None = None
         ) -> tuple[WatchState, list[Action]]:
    """The one place that changes state: validates against TRANSITIONS and logs the change."""
    if to not in TRANSITIONS[s.state]:
        raise TransitionError(f"{s.state} -> {to} is not allowed ({reason})")
    log = Log("info", "state.changed", {"from": str(s.state), "to": str(to), "reason": reason,
                                        "after_s": round(now - s.since, 3)})
    acts: list[Action] = [log]
    if s.state == S.STARTING and to != S.STARTING:  # the start guard runs until here
        acts.append(StartOver("ready" if to == S.READY else str(to)))
    proven = s.child.vllm if to == S.READY and s.child is not None else s.proven
    return replace(s, state=to, since=now, deadline=deadline, proven=proven), acts


def seeded(seed: int) -> int:
    """A valid xorshift64 state from any integer (zero is a fixed point, so avoid it)."""
    return (seed & 0xFFFFFFFFFFFFFFFF) or 0x2545F4914F6CDD1D


def next_random(s: WatchState) -> tuple[WatchState, float]:
    """A pure pseudo-random number in [0, 1) for jitter (xorshift64)."""
    x = s.rng
    x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 7
    x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
    return replace(s, rng=x), x / 2.0**64
