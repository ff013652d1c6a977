"""Pure: the restart sub-machine. Its rungs (`Phase`), the one table of allowed moves between
them, its record (`Restart`) and the one `goto` that validates and logs every move.

Between `restart.begin` (or `daemon.exiting`) and the next READY the daemon climbs down one
ladder: record the incident, drain, SIGTERM, SIGKILL, sweep, wait for the GPUs to give the
memory back, prewarm (first start only), back off, launch. Each rung is a Phase here, never a
flag on the state records (tests/core/test_architecture.py fails if one comes back); what a
rung waits on lives in the record beside it (`wait` while RECORDING, `gate` while
RELEASE_WAIT). An exit is the same ladder without the relaunch: its SWEEPING or
RELEASE_WAIT ends in Exit instead of the next rung (core/stopping.finish).

The coarse supervisor state (core/state.State, what systemd's STATUS= and /status have
always said) follows from the rung by one table (`COARSE`), as systemd's service.c maps its
SERVICE_STOP_SIGTERM, STOP_SIGKILL, ... onto a unit's few active states. The decisions of
each rung are made where they always were: core/ladder.py (begin, halt, after the sweep),
core/stopping.py (the take-down), core/incidents.py (the record); the GPU release gate's
record and pure check are here (`ReleaseGate`, `released`).

The spare-engine failover (issue 34; core/failover.py, core/spare.py). Its wake, serving,
route back and re-arm overlap the take-down and the relaunch instead of coming between two
rungs: a rung of this ladder would hold the record and the SIGTERM of the old tree behind
the wake (~0.7 s on the H200) and the relaunch behind the spare's drain. So the spare has
its own track with its own table and bounds (failover.Rung: off, building, asleep, waking,
serving, returning, down), moved by core/spare.py at fixed points of this ladder:
`restart.begin` wakes it (WakeSpare goes out before RecordIncident), RELEASE_WAIT's end
wakes it when NVML showed no room beside the dying tree, the full engine's READY routes
back and re-arms it, `halt` stops it from any rung. The one rung it adds here is the
first start's SPARE_BUILD: the spare is built, passes its canary and sleeps on the empty
GPU before the first LAUNCHING (coarse state "prewarming", bounded by the build's one answer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, ClassVar, Protocol, TypeVar

from vllmwatch.config.sections import Config
from vllmwatch.core.actions import Action, Log
from vllmwatch.core.names import Reason
from vllmwatch.core.samples import GpuProcess


class Phase(str, Enum):
    """The rung of the restart ladder the daemon is on; IDLE: no restart under way."""

    IDLE = "idle"
    RECORDING = "recording"  # the incident record is written before the tree is touched
    DRAINING = "draining"  # /readyz 503: wait for the balancer and the requests in flight
    TERMINATING = "terminating"  # SIGTERM (or the stuck engine's SIGKILL): the grace runs
    KILLING = "killing"  # SIGKILL to the group: wait for the exit
    SWEEPING = "sweeping"  # the Sweep of the old tree and the port is out
    RELEASE_WAIT = "release_wait"  # the old tree's GPU memory is not yet given back
    PREWARMING = "prewarming"  # the pre-warm steps before the first launch
    SPARE_BUILD = "spare_build"  # the spare is built on the empty GPU before the first launch
    BACKOFF = "backoff"  # the crash-loop backoff before the next launch
    LAUNCHING = "launching"  # the new child starts; READY ends the restart (IDLE)
    LAUNCH_WAIT = "launch_wait"  # the launch waits (a stopped spare's tree, the version read)

    def __str__(self) -> str:
        return self.value


P = Phase
_TAKE_DOWN = frozenset({P.RECORDING, P.DRAINING, P.TERMINATING, P.SWEEPING})
_AFTER_CLEANUP = frozenset({P.PREWARMING, P.SPARE_BUILD, P.BACKOFF, P.LAUNCHING})
TABLE: dict[Phase, frozenset[Phase]] = {
    P.IDLE: _TAKE_DOWN,
    P.RECORDING: _TAKE_DOWN,  # a second record (an exit's) replaces the restart's
    P.DRAINING: frozenset({P.RECORDING, P.TERMINATING, P.SWEEPING}),
    P.TERMINATING: frozenset({P.KILLING, P.SWEEPING}),
    P.KILLING: frozenset({P.SWEEPING}),
    P.SWEEPING: frozenset({P.RELEASE_WAIT}) | _AFTER_CLEANUP,
    P.RELEASE_WAIT: _AFTER_CLEANUP,
    P.PREWARMING: frozenset({P.LAUNCHING, P.SPARE_BUILD, P.SWEEPING}),
    P.SPARE_BUILD: frozenset({P.LAUNCHING, P.SWEEPING}),
    P.BACKOFF: frozenset({P.LAUNCHING, P.SWEEPING}),
    P.LAUNCHING: _TAKE_DOWN | {P.IDLE, P.LAUNCH_WAIT},
    P.LAUNCH_WAIT: frozenset({P.LAUNCHING, P.SWEEPING}),
}

# How long a rung can last: "deadline" the state's own deadline is set on it; "gate" the
# release gate's restart.gpu_release_timeout, judged at each GPU look's answer; "answer" it
# waits for the one result the shell owes for an effect (the loop posts exactly one per
# effect, bounded by the effect's own timeout: the sweep, the prewarm). On the way out every
# rung is bounded by a deadline (stop_timeout, KILL_WAIT, SWEEP_WAIT). IDLE is no rung.
BOUND: dict[Phase, str] = {
    P.IDLE: "", P.RECORDING: "deadline", P.DRAINING: "deadline", P.TERMINATING: "deadline",
    P.KILLING: "deadline", P.SWEEPING: "answer", P.RELEASE_WAIT: "gate",
    P.PREWARMING: "answer", P.SPARE_BUILD: "answer", P.BACKOFF: "deadline", P.LAUNCHING: "deadline",
    P.LAUNCH_WAIT: "deadline",
}

# A rung that waits on a worker's one answer ("answer", "gate") is bounded by that worker's
# own deadline; OVERDUE_S past it, the worker never answered (NVML or /proc stuck in the
# kernel, which no thread can interrupt): vllmwatch stops vouching to systemd (no WATCHDOG=1,
# no start extension), whose watchdog or start timeout then restarts the service with a
# fresh sweep, instead of waiting forever while saying all is well.
OVERDUE_S = 120.0
SWEEP_S = 60.0  # a sweep reads /proc of every process: seconds even on a busy box
SPARE_BUILD_S = 600.0  # core/failover.BUILD_TIMEOUT (not imported: a spare's run loads it)


def stuck(s: _Configured, now: float) -> bool:
    """Whether the rung under way has waited OVERDUE_S past its worker's own bound."""
    c, r = s.config, s.restart
    bound = r.bound if r.bound is not None else {
        P.SWEEPING: SWEEP_S, P.RELEASE_WAIT: c.restart.gpu_release_timeout,
        P.PREWARMING: c.prewarm.timeout, P.SPARE_BUILD: SPARE_BUILD_S}.get(r.phase)
    return bound is not None and now - r.since > bound + OVERDUE_S


# The coarse supervisor state(s) each rung shows as (core/state.State values).
COARSE: dict[Phase, frozenset[str]] = {
    P.IDLE: frozenset({"init", "ready"}),
    P.RECORDING: frozenset({"starting", "ready", "draining"}),
    P.DRAINING: frozenset({"draining"}),
    P.TERMINATING: frozenset({"stopping"}),
    P.KILLING: frozenset({"stopping"}),
    P.SWEEPING: frozenset({"cleanup"}),
    P.RELEASE_WAIT: frozenset({"cleanup"}),
    P.PREWARMING: frozenset({"prewarming"}),
    P.SPARE_BUILD: frozenset({"prewarming"}),
    P.BACKOFF: frozenset({"backoff"}),
    P.LAUNCHING: frozenset({"starting"}),
    P.LAUNCH_WAIT: frozenset({"backoff"}),  # (a wait before the launch, as a backoff is)
}


class PhaseError(RuntimeError):
    """A bug: the core asked for a move the restart table does not allow."""


# ---- the GPU release gate (RELEASE_WAIT): before a new child starts, the old tree's GPU
# memory must be free. Otherwise the new vLLM sizes its KV cache against memory the old one
# still holds, and fails or starts small. `released` is pure; the shell reads a sampler and
# applies it; the ladder polls it until it says yes or restart.gpu_release_timeout passes.


@dataclass(frozen=True)
class ReleaseGate:
    """The gate while it waits (beside core/drain.Drain, the other bounded wait of a restart):
    the old tree's pids, when it gives up, and when it looks next (None: a look is out)."""

    old_pids: tuple[int, ...]
    deadline: float  # restart.gpu_release_timeout after the sweep
    look_at: float | None = None
    opened: float = 0.0  # when the sweep handed over: the next look's interval grows from it


def due(gate: ReleaseGate | None, now: float) -> bool:
    """Whether the gate should look at the GPUs now (one look in flight at a time)."""
    return gate is not None and gate.look_at is not None and now >= gate.look_at


def released(old_pids: set[int], procs: list[GpuProcess] | None,
             device_used: Mapping[int, float], before_launch: Mapping[int, float],
             tolerance_mib: float) -> tuple[bool, str]:
    """True when NVML lists no process of the old tree and every GPU measured both before the
    launch and now is within tolerance of its pre-launch use; the text says why.

    procs None (process list unknown) decides on device memory alone; device memory unknown
    decides on processes alone; both unknown cannot hold a restart back.
    """
    waiting: list[str] = []
    if procs is not None:
        left = sorted((p.pid, p.gpu_index) for p in procs if p.pid in old_pids)
        if left:
            waiting.append("old processes still on the GPU: " + ", ".join(
                f"pid {pid} on GPU {gpu}" for pid, gpu in left))
    compared = sorted(set(device_used) & set(before_launch))
    for gpu in compared:
        now, before = device_used[gpu], before_launch[gpu]
        if now > before + tolerance_mib:
            waiting.append(f"GPU {gpu} uses {now:.0f} MiB, {now - before:.0f} MiB above its "
                           f"{before:.0f} MiB before launch (tolerance {tolerance_mib:g} MiB)")
    if waiting:
        return False, "; ".join(waiting)
    if procs is None and not compared:
        return True, "cannot verify: NVML gives neither processes nor device memory"
    basis = [] if procs is None else ["no old process on the GPU"]
    if compared:
        basis.append(f"device memory back within {tolerance_mib:g} MiB on GPU " +
                     ", ".join(str(g) for g in compared))
    return True, "; ".join(basis)


@dataclass(frozen=True)
class IncidentWait:
    """What RECORDING waits on (core/incidents.py): the answer to `seq`, or `until`; then
    take_down(drain)."""

    seq: int
    until: float
    drain: bool
    started: float
    reason: Reason


@dataclass(frozen=True)
class Restart:
    """The restart under way: its rung since when, why (None: the first start, or an exit
    with no restart under way), and what the rung waits on."""

    phase: Phase = P.IDLE
    since: float = 0.0
    reason: Reason | None = None
    detail: str = ""
    wait: IncidentWait | None = None  # RECORDING only
    gate: ReleaseGate | None = None  # RELEASE_WAIT only
    # The worker's own bound as in force when the rung began (stuck() judges by it): a
    # reload changes the config, not the wait under way, whose worker keeps its bound
    bound: float | None = None


class _Climbing(Protocol):
    """What the moves need of core/state.WatchState (which holds a Restart: typed by this
    protocol, not imported, so that state.py can import this module)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def restart(self) -> Restart: ...


class _Configured(_Climbing, Protocol):
    @property
    def config(self) -> Config: ...


_S = TypeVar("_S", bound=_Climbing)


def goto(s: _S, to: Phase, now: float, why: str, *, wait: IncidentWait | None = None,
         gate: ReleaseGate | None = None, bound: float | None = None
         ) -> tuple[_S, list[Action]]:
    """The one place that moves the ladder: validates against TABLE and logs `restart.phase`.
    The reason stays with the restart until READY (IDLE)."""
    r = s.restart
    if to not in TABLE[r.phase]:
        raise PhaseError(f"{r.phase} -> {to} is not allowed ({why})")
    log = Log("info", "restart.phase", {
        "from": str(r.phase), "to": str(to), "why": why, "after_s": round(now - r.since, 3),
        "reason": "" if r.reason is None else str(r.reason)})
    nxt = Restart(to, now, None, "") if to == P.IDLE else Restart(to, now, r.reason, r.detail)
    return replace(s, restart=replace(nxt, wait=wait, gate=gate, bound=bound)), [log]


def begin(s: _S, reason: Reason, detail: str) -> _S:
    """A restart for `reason` begins (on IDLE, or on a launch that failed): its rungs follow."""
    return replace(s, restart=replace(s.restart, reason=reason, detail=detail))


def pending(s: _S) -> Reason | None:
    """The reason of a restart that is under way and not yet relaunched."""
    r = s.restart
    return r.reason if r.phase not in (P.IDLE, P.LAUNCHING) else None


def on(s: _S, phase: Phase) -> bool:
    """Whether the ladder is on `phase`."""
    return s.restart.phase == phase
