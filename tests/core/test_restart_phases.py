"""The restart sub-machine (core/restart.py, core/restart.py) as tables: its own table is closed
and every rung is reached; (phase, event) -> (phase, actions) rows; a crash climbs down the
rungs in order, one `restart.phase` event each; a stop is honoured from every rung."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from tests.core.test_core_properties import CONFIG, STOP_BOUND, CoreMachine, _ready, run_to_exit
from vllmwatch.core import ladder, machine, restart
from vllmwatch.core.actions import Action, Log, Notify, RecordIncident, SignalGroup, Spawn, Sweep
from vllmwatch.core.events import (
    ChildExited,
    Event,
    IncidentRecorded,
    PrewarmDone,
    ReleaseChecked,
    RestartRequested,
    StopRequested,
    Tick,
)
from vllmwatch.core.restart import BOUND, COARSE, TABLE, Phase, PhaseError
from vllmwatch.core.state import FINAL, State, WatchState

P = Phase


class Recorder(CoreMachine):
    """The walk's world, keeping the last state seen on each rung (and the time)."""

    def __init__(self) -> None:
        self.seen: dict[Phase, tuple[WatchState, float]] = {}
        super().__init__()

    def _step(self, ev: Event) -> None:
        queue = [ev]
        while queue and not self.exited:
            self.s, acts = machine.step(self.s, queue.pop(0), self.now)
            self.seen[self.s.restart.phase] = (self.s, self.now)  # the last state on it
            self.history += acts
            self.answers = []
            for a in acts:
                self._effect(a)
            queue = self.answers + queue


def _exits(m: Recorder, code: int | None, sig: str | None) -> None:
    """The child exits (SIGKILL already emptied the world's live set)."""
    pid = _pid(m.s)
    m.alive.discard(pid)
    m._step(ChildExited(pid, code, sig))


def _ready_again(m: Recorder) -> None:
    """READY with no restart under way (RECORDING still shows as READY)."""
    for _ in range(30):
        if m.s.state == State.READY and m.s.restart.phase == P.IDLE:
            return
        if m.outstanding:
            m.world_is_kind(1)
        else:
            m.time_passes(5.0)
    raise AssertionError(f"never READY again: {m.s.state} {m.s.restart.phase}")


@functools.cache
def _climb() -> Recorder:
    """First start, a drained restart killed after its grace, a crash, two crashes in a row."""
    m = Recorder()
    _ready(m)  # sweeping -> prewarming -> launching -> idle
    m.time_passes(3.0)  # a memory sample names the tree's pids: the release gate waits on them
    m.world_is_kind(1)
    m.restart()  # draining
    m.time_passes(60.0)  # the drain's deadline: terminating
    m.time_passes(60.0)  # the grace: killing
    _exits(m, None, "SIGKILL")  # sweeping, then the release gate
    _ready_again(m)
    _exits(m, 1, None)  # recording
    _ready_again(m)
    _exits(m, 1, None)  # the second failure in a row backs off
    _ready_again(m)
    return m


def _phases(acts: list[Action]) -> list[tuple[str, str]]:
    return [(a.fields["from"], a.fields["to"]) for a in acts
            if isinstance(a, Log) and a.event == "restart.phase"]


def test_the_table_is_closed_and_every_rung_has_a_row() -> None:
    assert set(TABLE) == set(BOUND) == set(COARSE) == set(Phase)
    assert all(targets <= set(Phase) for targets in TABLE.values())
    assert all(BOUND[p] for p in Phase if p != P.IDLE), "a rung without a bound"
    assert all(COARSE[p] <= {str(s) for s in State} for p in Phase)
    reach, todo = {P.IDLE}, [P.IDLE]  # every rung reachable from IDLE, and IDLE from each
    while todo:
        for nxt in TABLE[todo.pop()] - reach:
            reach.add(nxt)
            todo.append(nxt)
    assert reach == set(Phase)
    back = {P.IDLE}
    while any(p not in back and TABLE[p] & back for p in Phase):
        back |= {p for p in Phase if TABLE[p] & back}
    assert back == set(Phase)


def test_a_move_outside_the_table_is_a_bug() -> None:
    s = machine.initial(CoreMachine().s.config, 0.0)
    with pytest.raises(PhaseError, match="idle -> launching"):
        restart.goto(s, P.LAUNCHING, 1.0, "no restart under way")


def _seen() -> dict[Phase, tuple[WatchState, float]]:
    """The climb's rungs, the first start's SPARE_BUILD from the spare's climb, and
    LAUNCH_WAIT from a launch that waits for a stopped spare's tree."""
    from tests.core.test_spare_failover import launch_waits, spare_climb

    spare = {p: v for p, v in spare_climb().seen.items() if isinstance(p, Phase)}
    waits = launch_waits()[0]
    return {**spare, P.LAUNCH_WAIT: (waits.s, waits.now), **_climb().seen}


def test_every_rung_is_reached_and_a_stop_is_honoured_on_each() -> None:
    seen = _seen()
    assert set(seen) == set(Phase)
    for phase, (s, now) in seen.items():
        history: list[Action] = []
        s2, acts = machine.step(s, StopRequested("SIGTERM"), now)
        history += acts
        s2, t = run_to_exit(s2, now, history)
        assert s2.state in FINAL, f"a stop on {phase} did not exit"
        assert t - now <= STOP_BOUND, f"a stop on {phase} took {t - now:.1f}s"
        # an exit is the ladder without the relaunch: no launch after the stop
        assert not [a for a in history if isinstance(a, Spawn)], phase


def test_the_rung_shows_as_its_coarse_state_and_has_a_bound() -> None:
    for phase, (s, _) in _seen().items():
        assert str(s.state) in COARSE[phase], (phase, s.state)
        assert s.restart.phase == phase
        if BOUND[phase] == "deadline":
            assert s.deadline is not None, phase
        if BOUND[phase] == "gate":
            assert s.restart.gate is not None and s.restart.gate.deadline > 0


def test_a_crash_climbs_down_the_rungs_in_order() -> None:
    """An EngineCore crash (vLLM's API server exits 0 unasked): record, sweep, wait for the
    GPUs, relaunch, ready; one `restart.phase` event per rung, with the coarse state beside."""
    m = Recorder()
    _ready(m)
    m.time_passes(3.0)
    m.world_is_kind(1)
    mark = len(m.history)
    _exits(m, 0, None)
    _ready_again(m)
    steps = _phases(m.history[mark:])
    assert steps == [("idle", "recording"), ("recording", "sweeping"),
                     ("sweeping", "release_wait"), ("release_wait", "launching"),
                     ("launching", "idle")]
    changed = [a for a in m.history[mark:] if isinstance(a, Log) and a.event == "restart.phase"]
    assert all(a.fields["reason"] == "crash" for a in changed[:-1])


def _at(phase: Phase) -> tuple[WatchState, float]:
    return _climb().seen[phase]


def _pid(s: WatchState) -> int:
    assert s.child is not None and s.child.pid is not None
    return s.child.pid


def _deadline(s: WatchState, now: float) -> tuple[Event, float]:
    assert s.deadline is not None
    return Tick(), s.deadline


def _seq(s: WatchState, now: float) -> tuple[Event, float]:
    assert s.restart.wait is not None
    return IncidentRecorded(s.restart.wait.seq, "i-1", "/i/1"), now


Row = tuple[Phase, Callable[[WatchState, float], tuple[Event, float]], Phase, set[type]]
ROWS: list[Row] = [
    (P.IDLE, lambda s, t: (ChildExited(_pid(s), 1, None), t), P.RECORDING, {RecordIncident}),
    (P.IDLE, lambda s, t: (RestartRequested(), t), P.DRAINING, set()),
    (P.IDLE, lambda s, t: (StopRequested("SIGTERM"), t), P.TERMINATING, {SignalGroup, Notify}),
    (P.RECORDING, _seq, P.SWEEPING, {Sweep}),
    (P.RECORDING, _deadline, P.SWEEPING, {Sweep}),
    (P.DRAINING, _deadline, P.TERMINATING, {SignalGroup}),
    (P.DRAINING, lambda s, t: (ChildExited(_pid(s), 0, None), t), P.SWEEPING, {Sweep}),
    (P.TERMINATING, _deadline, P.KILLING, {SignalGroup}),
    (P.TERMINATING, lambda s, t: (ChildExited(_pid(s), 0, None), t), P.SWEEPING, {Sweep}),
    (P.KILLING, _deadline, P.SWEEPING, {Sweep}),
    (P.KILLING, lambda s, t: (ChildExited(_pid(s), None, "SIGKILL"), t), P.SWEEPING, {Sweep}),
    # the last gate of the climb is the second failure in a row's: released, it backs off
    # (the first failure's relaunches at once: test_a_crash_climbs_down_the_rungs_in_order)
    (P.RELEASE_WAIT, lambda s, t: (ReleaseChecked(True, "ok"), t), P.BACKOFF, set()),
    (P.PREWARMING, lambda s, t: (PrewarmDone(True), t), P.LAUNCHING, {Spawn}),
    (P.BACKOFF, _deadline, P.LAUNCHING, {Spawn}),
    (P.BACKOFF, lambda s, t: (RestartRequested(), t), P.LAUNCHING, {Spawn}),
    (P.LAUNCHING, lambda s, t: (ChildExited(_pid(s), 1, None), t), P.RECORDING,
     {RecordIncident}),
]


@pytest.mark.parametrize(("phase", "event", "to", "kinds"), ROWS,
                         ids=[f"{r[0]}-{r[2]}-{i}" for i, r in enumerate(ROWS)])
def test_phase_event_table(phase: Phase, event: Callable[[WatchState, float],
                           tuple[Event, float]], to: Phase, kinds: set[type]) -> None:
    s, now = _at(phase)
    ev, now = event(s, now)
    s2, acts = machine.step(s, ev, now)
    assert s2.restart.phase == to, _phases(acts)
    assert kinds <= {type(a) for a in acts}, acts
    assert _phases(acts)[0] == (str(phase), str(to)) or to == phase


@pytest.mark.parametrize(("reason", "cut"), [
    ("hang", True), ("stall", True), ("engine_died", False), ("health", False),
    ("gpu_memory", False), ("manual", False)])
def test_a_stuck_engines_requests_are_cut_at_the_verdict(reason: str, cut: bool) -> None:
    """Issue 35: a hang or stall verdict tells the gate at once (StopSending), before the
    incident record and before any signal; other restarts leave their requests be."""
    from vllmwatch.core.actions import KillEngines, StopSending
    from vllmwatch.core.ladder import begin_restart
    from vllmwatch.core.names import Reason

    s, now = _at(P.IDLE)
    assert s.state == State.READY
    _s2, acts = begin_restart(s, now, Reason(reason), "the verdict", drain=False)
    kinds = [type(a) for a in acts]
    assert (StopSending in kinds) is cut, kinds
    if cut:
        first_effect = min(kinds.index(k) for k in (RecordIncident, SignalGroup, KillEngines)
                           if k in kinds)
        assert kinds.index(StopSending) < first_effect, kinds


def test_the_release_gate_looks_again_soon_then_every_second() -> None:
    """Issue 33: a killed engine's GPU memory comes back within about a second; a gate that
    waited a fixed second after a look that found it held lost most of that second. The next
    look comes after half the time waited, from RELEASE_POLL_MIN up to RELEASE_POLL."""
    s, now = _at(P.RELEASE_WAIT)
    gate = s.restart.gate
    assert gate is not None and gate.opened <= now
    looks = []
    t = gate.opened
    for _ in range(40):
        s, acts = machine.step(s, ReleaseChecked(False, "held"), t)
        assert s.restart.phase == P.RELEASE_WAIT and acts == [], acts
        g = s.restart.gate
        assert g is not None and g.look_at is not None
        looks.append(round(g.look_at - t, 3))
        t = g.look_at
        s, acts = machine.step(s, Tick(), t)  # due: one look goes out
        assert [type(a).__name__ for a in acts] == ["CheckRelease"], acts
        if t >= gate.deadline:
            break
    assert looks[0] == ladder.RELEASE_POLL_MIN
    assert looks == sorted(looks) and max(looks) == ladder.RELEASE_POLL
    assert sum(1 for x in looks if x < ladder.RELEASE_POLL) <= 12  # bounded extra looks
    at = [sum(looks[:i + 1]) for i in range(len(looks))]  # each look, after the first
    assert len([a for a in at if a <= 1.0]) >= 5  # several looks within the first second


# ---- the first rung's clock ------------------------------------------------------------------

UPTIME = 864000.0  # a box up for ten days: time.monotonic() is about its uptime


def test_the_first_restart_phase_counts_from_the_daemons_start_not_the_boot() -> None:
    """The initial rung's `since` was 0.0: the first `restart.phase` said after_s = uptime."""
    s = machine.initial(CONFIG, UPTIME)
    _, acts = machine.step(s, Tick(), UPTIME + 0.01)
    first = next(a.fields for a in acts if isinstance(a, Log) and a.event == "restart.phase")
    assert first["from"] == "idle" and first["after_s"] == 0.01, first


def test_every_clock_of_the_initial_state_starts_now() -> None:
    s = machine.initial(CONFIG, UPTIME)
    assert s.since == s.restart.since == UPTIME


def test_a_restart_asked_on_a_rung_that_ignores_it_says_truly_why() -> None:
    """A SIGUSR1 during the first start's pre-warm (minutes) or its first sweep logged
    restart.ignored "a restart is already under way": none was, vLLM had never run."""
    said: dict[Phase, str] = {}
    for phase, (s, now) in _seen().items():
        _, acts = machine.step(s, RestartRequested(), now)
        ignored = [a for a in acts if isinstance(a, Log) and a.event == "restart.ignored"]
        if not ignored:
            continue
        said[phase] = detail = str(ignored[0].fields["detail"])
        if s.exit_code is not None:
            assert detail == "vllmwatch is stopping", (phase, detail)
        elif restart.pending(s) is not None:
            assert detail == "a restart is already under way", (phase, detail)
        else:
            assert detail == "vLLM's first start is under way", (phase, detail)
    assert said.get(P.PREWARMING) == "vLLM's first start is under way", said
