"""Pure: the sleeping spare engine and the failover to it (issue 34 points 2-4); the design
is in core/restart.py's docstring.

The spare's own track (`Rung`, `TABLE`, `BOUND`) runs beside the restart ladder: it is
imported, and `WatchState.spare` set, only when the shell's plan turned the spare on, so a
daemon without it runs none of this. The shell answers each action with exactly one event,
bounded by the action's own timeout (as the sweep and the prewarm): BuildSpare ->
SpareBuilt, WakeSpare -> SpareWoken, SleepSpare -> SpareSlept; StopSpare and Route are done
at once. SpareExited comes when the spare's tree dies unasked.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from vllmwatch.core.actions import Action, Log, SpareAction
from vllmwatch.core.events import SpareEvent
from vllmwatch.core.names import Reason

BUILD_TIMEOUT = 600.0  # READY on the empty H200 took 63.9 s and the first sleep 15.4 s
SLEEP_TIMEOUT = 60.0  # the spare's drain (bounded by restart.drain_timeout) and /sleep
# A spare that lived this long after its build was sound: its death starts a new count. One
# that dies sooner (the host OOM killer on its pinned weights, a sleep-mode bug) counts
# against spare.retries like a failed build: never rebuilt forever.
STEADY = 600.0
# A GPU fault (exit 6) leaves no GPU to fail over on; the daemon's own exits take the spare
# down with everything else. Every other restart leaves the GPU usable.
NO_FAILOVER = frozenset({Reason.GPU_FAULT})
# What a spare is built from, by part (the vLLM command, its adapters, its environment, the
# API key the key file held, the GPU list), each as a digest the shell computed: ((part,
# digest), ...). A reload that changes any part rebuilds the spare (changed()); the adapters
# are a part of their own, as a live change of them relaunches no serving engine.
Inputs = tuple[tuple[str, str], ...]
COMMAND, ADAPTERS = "the vLLM command", "the adapters"


class Rung(str, Enum):
    """Where the spare is."""

    OFF = "off"  # not wanted, or turned off (`Track.why` says why)
    BUILDING = "building"  # its tree starts, passes its own canary and goes to sleep
    ASLEEP = "asleep"  # armed: ~2 GiB of GPU, its weights in pinned host memory
    WAKING = "waking"  # /wake_up sent; proven awake by /is_sleeping false and a canary
    SERVING = "serving"  # the gate routes to it while the full engine relaunches
    RETURNING = "returning"  # the full engine is READY: routed back, it drains and sleeps
    DOWN = "down"  # died or broken: rebuilt once the full engine is READY

    def __str__(self) -> str:
        return self.value


R = Rung
TABLE: dict[Rung, frozenset[Rung]] = {
    R.OFF: frozenset({R.BUILDING, R.DOWN}),  # DOWN: a reload turns it back on
    R.BUILDING: frozenset({R.ASLEEP, R.BUILDING, R.DOWN, R.OFF}),
    R.ASLEEP: frozenset({R.WAKING, R.DOWN, R.OFF}),
    # ASLEEP: no room beside the dying tree (woken after its release); RETURNING: awake
    # after the full engine was READY again
    R.WAKING: frozenset({R.SERVING, R.ASLEEP, R.RETURNING, R.DOWN, R.OFF}),
    R.SERVING: frozenset({R.RETURNING, R.DOWN, R.OFF}),
    R.RETURNING: frozenset({R.ASLEEP, R.DOWN, R.OFF}),
    R.DOWN: frozenset({R.BUILDING, R.OFF}),
}
# How long a rung lasts: "answer" the shell owes one event, bounded by the action's timeout;
# "ladder" SERVING ends at the full engine's READY or the daemon's exit, both bounded by the
# restart ladder's own rungs; "rest" a resting rung (nothing is waited on).
BOUND: dict[Rung, str] = {
    R.OFF: "rest", R.BUILDING: "answer", R.ASLEEP: "rest", R.WAKING: "answer",
    R.SERVING: "ladder", R.RETURNING: "answer", R.DOWN: "rest",
}


class SpareError(RuntimeError):
    """A bug: a move the spare's table does not allow."""


# ---- actions (the shell does them) and events (the shell saw them) ----

@dataclass(frozen=True)
class BuildSpare(SpareAction):
    """Start the spare's tree (own group, VLLMWATCH::spare, its Unix socket), wait for its
    canary, sleep it (level 1); answer SpareBuilt within `timeout`."""

    timeout: float
    build: int = 0  # Track.build: its answer and every event of this build carry it


@dataclass(frozen=True)
class WakeSpare(SpareAction):
    """Wake the spare when NVML shows room for it (else answer no_room), then prove it awake
    (/is_sleeping false and a canary); answer SpareWoken within `timeout`."""

    timeout: float


@dataclass(frozen=True)
class SleepSpare(SpareAction):
    """Let the spare finish what it serves (at most `drain`), then /sleep?level=1; answer
    SpareSlept within `timeout`."""

    drain: float
    timeout: float


@dataclass(frozen=True)
class StopSpare(SpareAction):
    """Take the spare's whole group down now (SIGTERM, then SIGKILL) and sweep it."""

    why: str


@dataclass(frozen=True)
class Route(SpareAction):
    """Where the gate sends new and held requests: "full" or "spare"."""

    to: str


@dataclass(frozen=True)
class SpareBuilt(SpareEvent):
    ok: bool
    detail: str = ""
    pid: int | None = None
    awake_mib: float | None = None  # its GPU figure awake (READY, before the sleep)
    asleep_mib: float | None = None  # ... and asleep
    inputs: Inputs = ()  # what this build ran (the shell's digests; () unknown)
    build: int = 0  # BuildSpare.build it answers (0: unknown)
    # Not built, not failed: the serving engine running now was launched without the room
    # this spare takes (a reload turned it on): built after that engine's next launch
    deferred: bool = False
    # Failed for a cause every try on this host meets alike (NVML gives no figure for the
    # spare's processes): off at once, never retried (each try is a full vLLM start)
    permanent: bool = False


@dataclass(frozen=True)
class SpareWoken(SpareEvent):
    ok: bool
    detail: str = ""
    seconds: float = 0.0  # from the wake call to the canary's answer
    no_room: bool = False  # NVML shows no room beside the dying tree: nothing was asked


@dataclass(frozen=True)
class SpareSlept(SpareEvent):
    ok: bool
    detail: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class SpareExited(SpareEvent):
    pid: int
    detail: str = ""


@dataclass(frozen=True)
class SpareChecked(SpareEvent):
    """The serving spare's canary (the shell checks it at probe.canary_interval while the
    gate routes to it): answered (`ok`), else `detail`; `moved`: its token counters moved
    since the last check (busy: a full KV cache queues a canary, the engine still works)."""

    ok: bool
    detail: str = ""
    pid: int | None = None
    moved: bool = False


SPARE_EVENTS = (SpareBuilt, SpareWoken, SpareSlept, SpareExited, SpareChecked)


@dataclass(frozen=True)
class Track:
    """The spare as the core knows it. `why`: why it is on or off (the plan's words, or what
    turned it off); `late`: the wake waits for the old tree's release."""

    why: str
    retries: int
    rung: Rung = R.OFF
    since: float = 0.0
    wanted: bool = True
    failed_builds: int = 0  # in a row; `retries` of them turn it off until the next reload
    pid: int | None = None
    awake_mib: float | None = None
    asleep_mib: float | None = None
    late: bool = False
    began: float | None = None  # restart.begin of the failover under way
    served_at: float | None = None
    failovers: int = 0
    last_seconds: float | None = None  # restart.begin -> the spare serves, last failover
    # Why it runs a command the config no longer has (a reload changed the vLLM command): it
    # is stopped and rebuilt from the current config as soon as nothing waits on it.
    stale: str = ""
    built_from: Inputs = ()  # the running (or last) spare's inputs, from its SpareBuilt
    # A reload's inputs while a build was out: that build read the files before the reload
    want: Inputs = ()
    # Builds so far (per daemon, increasing): the spare's events name the build they are of,
    # so a person pairs a spare.build_failed with its spare.state to=building across retries
    build: int = 0
    built_at: float | None = None  # when the running (or last) spare passed its build
    lost: int = 0  # in a row: spares that died within STEADY s of their build
    # A pid reaped while its build's answer was still out (the same loop turn): that
    # answer's "built" is of a dead tree
    dead: tuple[int, str] | None = None
    down_why: str = ""  # why it went DOWN last (a failed wake, a death): what status says
    unanswered: int = 0  # serving: canaries in a row unanswered while its counters stood still


def changed(built: Inputs, now: Inputs, skip: tuple[str, ...] = ()) -> str:
    """The parts of what the spare was built from that differ now, in words ("" when none;
    a part unknown on either side is not compared: an unreadable key file is no change);
    `skip`: parts not compared."""
    new_ = dict(now)
    diff = [part for part, digest in built
            if part in new_ and new_[part] != digest and part not in skip]
    return f"{', '.join(diff)} changed" if diff else ""


def checked(t: Track, ev: SpareChecked, threshold: int) -> tuple[Track, str]:
    """A check of the serving spare: its track, and "" or why it is hung (`threshold`
    canaries in a row unanswered while its token counters stood still: nothing served)."""
    if t.rung != R.SERVING or ev.pid != t.pid:
        return t, ""  # an earlier spare's, or a check that landed after the spare served
    if ev.ok or ev.moved:
        return replace(t, unanswered=0), ""
    n = t.unanswered + 1
    if n < threshold:
        return replace(t, unanswered=n), ""
    return replace(t, unanswered=0), (f"hung while serving: {n} canaries in a row unanswered "
                                      f"and its token counters still ({ev.detail})")


def new(wanted: bool, why: str, retries: int) -> Track:
    """The track at the daemon's start: `wanted` from the shell's plan (SparePlan)."""
    return Track(why=why, retries=max(1, retries), wanted=wanted)


def move(t: Track, to: Rung, now: float, why: str) -> tuple[Track, list[Action]]:
    """The one place that moves the spare: validates against TABLE and logs `spare.state`."""
    if to not in TABLE[t.rung]:
        raise SpareError(f"{t.rung} -> {to} is not allowed ({why})")
    build = t.build + 1 if to == R.BUILDING else t.build  # each build numbered here, once
    log = Log("info", "spare.state", {"build": build, "from": str(t.rung), "to": str(to),
                                      "why": why, "after_s": round(now - t.since, 3)})
    down = why if to == R.DOWN else t.down_why
    return replace(t, rung=to, since=now, build=build, down_why=down), [log]


def off(t: Track, now: float, last_error: str, permanent: bool = False
        ) -> tuple[Track, list[Action]]:
    """Off until the next reload: `spare.retries` failed builds in a row, or a permanent one."""
    why = f"not retried, off until the next reload: {last_error}" if permanent else \
        f"{t.failed_builds} failed builds (spare.retries): off until the next reload"
    t, acts = move(replace(t, wanted=False, why=why), R.OFF, now, why)
    return t, [*acts, Log("warning", "spare.off", {
        "build": t.build, "why": why, "last_error": last_error,
        "hint": "read the spare's lines above, fix the cause, then reload (SIGHUP)"})]


def fails_over(t: Track, reason: Reason) -> tuple[bool, str]:
    """Whether a restart for `reason` wakes the spare, and the words restart.begin says."""
    if reason in NO_FAILOVER:
        return False, f"none: a {reason} leaves no usable GPU"
    if t.began is not None and t.rung != R.SERVING:
        # A restart while a failover waits (waking, deferred to its sleep or to the dying
        # tree's release) joins it: one failover.begin, answered once, one wake at a time.
        return False, "the failover under way goes on: the spare serves once it is awake"
    if t.stale and t.rung == R.ASLEEP:
        return False, f"none: the spare runs the command before the reload ({t.stale})"
    if t.rung == R.ASLEEP:
        return True, "the spare wakes and serves until the full engine is READY"
    if t.rung == R.RETURNING and not t.stale:
        return True, ("the spare, going back to sleep after the last failover, wakes again "
                      "as soon as it sleeps and serves until the full engine is READY")
    if t.rung in (R.SERVING, R.WAKING):
        return False, "the spare serves already"
    if t.rung == R.OFF:
        return False, f"none: the spare is off ({t.why})"
    return False, f"none: the spare is {t.rung}"


def room(free_mib: float | None, awake_mib: float | None, asleep_mib: float | None,
         margin_mib: float = 512.0) -> tuple[bool, str]:
    """Whether waking the spare now cannot run the GPU out of memory: what it adds awake
    (awake - asleep, measured at its build) fits in NVML's free memory with a margin.
    Unknown figures say no: a wake that may OOM the spare is never tried."""
    if free_mib is None or awake_mib is None:
        return False, "the spare's footprint or the GPU's free memory is unknown"
    need = awake_mib - (asleep_mib or 0.0) + margin_mib
    if free_mib >= need:
        return True, f"{free_mib:.0f} MiB free, the spare needs {need:.0f} MiB awake"
    return False, (f"{free_mib:.0f} MiB free beside the old tree, the spare needs "
                   f"{need:.0f} MiB awake")


def who_serves(state: str, restart_idle: bool, t: Track | None) -> str:
    """Who answers the gate's requests now: "spare", "full" or "nobody"."""
    if t is not None and t.rung == R.SERVING:
        return "spare"
    return "full" if state == "ready" and restart_idle else "nobody"


def degraded(t: Track | None) -> str:
    """The STATUS= words while the spare serves ("" otherwise)."""
    return "degraded: spare serving" if t is not None and t.rung == R.SERVING else ""


def fields(t: Track, now: float) -> dict[str, object]:
    """The failover's seconds so far, for the failover.* events and the incident record."""
    out: dict[str, object] = {"build": t.build, "failovers": t.failovers}
    if t.began is not None:
        out["since_restart_begin_s"] = round(now - t.began, 3)
    if t.served_at is not None:
        out["served_s"] = round(now - t.served_at, 3)
    return out
