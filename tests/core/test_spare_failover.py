"""The spare engine's track and the failover (core/failover.py, core/spare.py, issue 34
points 2-4) as tables and walks: its table is closed and every rung reached; the first start
builds the spare before the full engine; every restart that leaves the GPU usable wakes it
before the record, routes to it once it is proven awake and back at the full engine's READY;
a stop is honoured on every rung and always stops the spare; hypothesis walks the whole core
with the spare on and a world whose spare answers, fails, dies or never answers."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from tests.core.test_core_properties import (
    CONFIG,
    OTHER,
    STOP_BOUND,
    CoreMachine,
    check_one_way_out,
    run_to_exit,
)
from vllmwatch.config.schema import Config
from vllmwatch.core import failover, ladder, machine
from vllmwatch.core.actions import Action, Log, RecordIncident, SignalGroup, Spawn
from vllmwatch.core.events import (
    ChildExited,
    Event,
    LaunchMayGo,
    ReloadRequested,
    RestartRequested,
    Spawned,
    StopRequested,
)
from vllmwatch.core.failover import (
    BOUND,
    TABLE,
    BuildSpare,
    Route,
    SleepSpare,
    SpareBuilt,
    SpareChecked,
    SpareExited,
    SpareSlept,
    SpareWoken,
    StopSpare,
    WakeSpare,
)
from vllmwatch.core.failover import Rung as R
from vllmwatch.core.names import REASONS, Reason
from vllmwatch.core.restart import Phase
from vllmwatch.core.state import FINAL, S, WatchState
from vllmwatch.core.stopping import LAUNCH_WAIT
from vllmwatch.status.snapshot import Snapshot
from vllmwatch.status.statusline import snapshot_of, summary

SPARE_ACTIONS = (BuildSpare, WakeSpare, SleepSpare)
SPARE_OFF = dataclasses.replace(CONFIG, spare=dataclasses.replace(CONFIG.spare, enabled="false"))


class SpareWorld(CoreMachine):
    """The core's world with the spare on: BuildSpare, WakeSpare and SleepSpare are out
    until answered; `seen` keeps the last state on each rung of both tracks."""

    def __init__(self, retries: int = 2) -> None:
        self.retries = retries
        self.spare_pid = 5000
        self.seen: dict[object, tuple[WatchState, float]] = {}
        self.spare_out: list[object] = []  # the spare's actions not yet answered
        self.changed_at = -1  # history's length at the last reload that changed the command
        super().__init__()

    def first_build_out(self, config: Config) -> None:
        """Start the world with `config`: step until the first BuildSpare is out."""
        self._step(ReloadRequested(config))  # starts the world: the first build is out
        for _ in range(10):
            if self.spare_out:
                break
            self.world_is_kind(1) if self.outstanding else self.time_passes(1.0)

    def _step(self, ev: Event) -> None:
        if self.s.spare is None:  # the shell's plan said on: set before the first step
            self.s = dataclasses.replace(self.s, spare=failover.new(True, "test", self.retries))
        if isinstance(ev, ReloadRequested) and ev.config is not None \
                and ev.config.vllm != self.s.config.vllm and not self.exited:
            self.changed_at = len(self.history)
        queue = [ev]
        while queue and not self.exited:
            self.s, acts = machine.step(self.s, queue.pop(0), self.now)
            if self.s.spare is not None:
                self.seen[self.s.spare.rung] = (self.s, self.now)
            self.seen[self.s.restart.phase] = (self.s, self.now)
            self.history += acts
            self.answers = []
            for a in acts:
                self._effect(a)
            queue = self.answers + queue

    def _effect(self, a: Action) -> None:
        if isinstance(a, SPARE_ACTIONS):
            self.spare_out.append(a)
            return
        super()._effect(a)

    def spare_answers(self, kind: type, ev: Event) -> None:
        i = next(i for i, a in enumerate(self.spare_out) if isinstance(a, kind))
        self.spare_out.pop(i)
        self._step(ev)

    def kind_spare(self, a: object) -> Event:
        if isinstance(a, BuildSpare):
            self.spare_pid += 1
            return SpareBuilt(True, "", self.spare_pid, 27202.0, 1932.0)
        if isinstance(a, WakeSpare):
            return SpareWoken(True, "", 0.7)
        return SpareSlept(True, "", 0.36)

    @precondition(lambda self: bool(self.outstanding or self.spare_out))
    @rule(turns=st.integers(1, 6))
    def world_is_kind(self, turns: int) -> None:
        for _ in range(turns):
            spare, self.spare_out = self.spare_out, []
            for a in spare:
                self._step(self.kind_spare(a))
            super().world_is_kind(1)

    # ---- the hypothesis rules the spare adds ----

    @precondition(lambda self: bool(self.spare_out))
    @rule(how=st.sampled_from(["ok", "fail", "no_room", "lost"]))
    def spare_answers_one(self, how: str) -> None:
        a = self.spare_out.pop(0)
        if how == "ok":
            self._step(self.kind_spare(a))
        elif how == "fail":
            self._step({BuildSpare: SpareBuilt(False, "boom"), WakeSpare: SpareWoken(
                False, "boom"), SleepSpare: SpareSlept(False, "boom")}[type(a)])
        elif how == "no_room" and isinstance(a, WakeSpare):
            self._step(SpareWoken(False, "no room", no_room=True))

    @precondition(lambda self: self.s.spare is not None and self.s.spare.pid is not None)
    @rule()
    def spare_dies(self) -> None:
        assert self.s.spare is not None and self.s.spare.pid is not None
        self._step(SpareExited(self.s.spare.pid, "SIGKILL"))

    @precondition(lambda self: self.s.spare is not None and self.s.spare.pid is not None)
    @rule(ok=st.booleans(), moved=st.booleans(), times=st.integers(1, 4))
    def spare_checked(self, ok: bool, moved: bool, times: int) -> None:
        """The shell's checks of the serving spare (any rung: a late one lands anywhere)."""
        for _ in range(times):
            assert self.s.spare is not None
            self._step(SpareChecked(ok, "canary: timed out", self.s.spare.pid, moved))

    @rule(which=st.sampled_from(["off", "on", "other"]))
    def spare_reload(self, which: str) -> None:
        self._step(ReloadRequested({"off": SPARE_OFF, "on": CONFIG, "other": OTHER}[which]))

    @invariant()
    def an_armed_spare_runs_the_current_command(self) -> None:
        """Asleep, waking, serving or returning: built after the last reload that changed
        the vLLM command, or marked stale (rebuilt as soon as its answer is in)."""
        t = self.s.spare
        if t is None or self.exited or t.rung not in (R.ASLEEP, R.WAKING, R.SERVING,
                                                       R.RETURNING):
            return
        builds = [i for i, a in enumerate(self.history) if isinstance(a, BuildSpare)]
        assert t.stale or (builds and builds[-1] >= self.changed_at), "spare runs the old command"

    @invariant()
    def a_spare_turned_off_by_the_config_stays_off(self) -> None:
        t = self.s.spare
        if t is not None and self.s.config.spare.enabled == "false" \
                and self.s.exit_code is None:
            assert t.rung == R.OFF and not t.wanted

    @invariant()
    def the_spare_is_stopped_on_the_way_out(self) -> None:
        if not self.exited:
            return
        builds = [i for i, a in enumerate(self.history) if isinstance(a, BuildSpare)]
        stops = [i for i, a in enumerate(self.history) if isinstance(a, StopSpare)]
        assert not builds or (stops and stops[-1] > builds[-1]), "the spare outlived the exit"

    @invariant()
    def the_first_start_waits_only_on_a_build_under_way(self) -> None:
        """On Phase.SPARE_BUILD the full engine waits for the spare's answer: a spare no
        longer building (stopped, failed for good, turned off by a reload) must have let it
        launch, else the daemon waits forever (EXTEND_TIMEOUT keeps systemd waiting too)."""
        t = self.s.spare
        if self.s.restart.phase == Phase.SPARE_BUILD and self.s.exit_code is None:
            assert t is not None and t.rung == R.BUILDING, f"first start stuck: {t}"

    @invariant()
    def never_two_engines_start_side_by_side(self) -> None:
        """A spare builds only on the empty GPU (the first start) or beside a serving
        engine that is not being restarted: a restart stops a rebuild under way."""
        t = self.s.spare
        if t is not None and t.rung == R.BUILDING and self.s.exit_code is None:
            assert self.s.restart.phase in (Phase.IDLE, Phase.SPARE_BUILD), \
                f"the spare builds while the full engine is on {self.s.restart.phase}"

    @invariant()
    def every_failover_begun_is_answered(self) -> None:
        """`journalctl -g failover` at 3 a.m.: each failover.begin is answered once, by
        failover.served, .failed or .overtaken (the full engine READY first); one is open only
        while a failover is under way (begun, not serving yet)."""
        t = self.s.spare
        said = [a.event for a in self.history if isinstance(a, Log)]
        ended = sum(said.count(e) for e in ("failover.served", "failover.failed",
                                            "failover.overtaken"))
        under_way = t is not None and t.began is not None and t.rung != R.SERVING
        assert said.count("failover.begin") - ended == under_way, (said, t)

    @invariant()
    def the_status_line_says_every_failover(self) -> None:
        """`systemctl status` at 3 a.m.: STATUS= says a failover under way (waking, or its
        wake deferred) as well as one served; it said only the one served."""
        t = self.s.spare
        line = summary(snapshot_of(self.s, self.now, 1.7e9, Snapshot(), None))
        under_way = t is not None and t.began is not None and t.rung != R.SERVING
        assert ("failover: spare" in line) == under_way, (line, t)
        assert ("degraded: spare serving" in line) == (t is not None and t.rung == R.SERVING)

    @invariant()
    def the_spare_rung_is_in_its_table(self) -> None:
        t = self.s.spare
        assert t is not None and t.rung in TABLE
        if t.rung == R.SERVING:
            assert self.s.exit_code is None


SpareWorld.TestCase.settings = settings(
    max_examples=80, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestSpareCore = SpareWorld.TestCase


# ---- helpers ----

def _ready(m: SpareWorld) -> None:
    for _ in range(80):
        if m.s.state == S.READY and m.s.restart.phase == Phase.IDLE and not m.spare_out:
            return
        if m.outstanding or m.spare_out:
            m.world_is_kind(1)
        else:
            m.time_passes(5.0)
    raise AssertionError(f"never READY: {m.s.state} {m.s.restart.phase}")


def _pid(m: SpareWorld) -> int:
    assert m.s.child is not None and m.s.child.pid is not None
    return m.s.child.pid


def _crash(m: SpareWorld) -> int:
    pid = _pid(m)
    m.alive.discard(pid)
    mark = len(m.history)
    m._step(ChildExited(pid, 1, None))
    return mark


def _logs(acts: list[Action], event: str) -> list[Log]:
    return [a for a in acts if isinstance(a, Log) and a.event == event]


def _index(acts: list[Action], kind: type) -> int:
    return next(i for i, a in enumerate(acts) if isinstance(a, kind))


def _rung(m: SpareWorld) -> R:
    assert m.s.spare is not None
    return m.s.spare.rung


@functools.cache
def spare_climb() -> SpareWorld:
    """Every rung of both tracks: a first start that builds the spare, a failover and the way
    back, a wake with no room, a failed wake, the spare dying asleep, builds that fail."""
    m = SpareWorld(retries=2)
    _ready(m)
    m.time_passes(3.0)
    m.world_is_kind(1)
    _crash(m)  # waking -> serving
    _ready(m)  # returning -> asleep
    m.time_passes(70.0)  # the next failure is after a stable run: no backoff
    _crash(m)
    m.spare_answers(WakeSpare, SpareWoken(False, "full", no_room=True))  # asleep, late
    _ready(m)  # woken after the release, then back
    m.time_passes(70.0)
    _crash(m)
    m.spare_answers(WakeSpare, SpareWoken(False, "wake_up 500"))  # down; rebuilt at READY
    _ready(m)
    assert m.s.spare is not None and m.s.spare.pid is not None
    m._step(SpareExited(m.s.spare.pid, "SIGKILL"))  # down, rebuilt at once beside READY
    m.spare_answers(BuildSpare, SpareBuilt(False, "boom"))
    m.spare_answers(BuildSpare, SpareBuilt(False, "boom"))  # off: 2 failed builds
    return m


# ---- tables ----

def test_the_spare_table_is_closed_and_every_rung_is_reached() -> None:
    assert set(TABLE) == set(BOUND) == set(R)
    assert all(BOUND[r] for r in R)
    m = spare_climb()
    assert set(R) <= set(m.seen), set(R) - set(m.seen)
    assert Phase.SPARE_BUILD in m.seen


def test_a_move_outside_the_table_is_a_bug() -> None:
    t = failover.new(True, "test", 2)
    with pytest.raises(failover.SpareError, match="off -> serving"):
        failover.move(t, R.SERVING, 1.0, "never")


def test_the_spare_is_built_before_the_full_engine() -> None:
    m = SpareWorld()
    _ready(m)
    build, spawn = _index(m.history, BuildSpare), _index(m.history, Spawn)
    built = next(i for i, a in enumerate(m.history) if isinstance(a, Log)
                 and a.event == "spare.ready")
    assert build < built < spawn
    assert _rung(m) == R.ASLEEP


@pytest.mark.parametrize("reason", [r for r in Reason if r.value in (
    "crash", "hang", "stall", "gpu_memory", "host_memory", "start_timeout", "manual", "reload",
    "health", "engine_died")])
def test_every_restart_that_leaves_the_gpu_usable_fails_over(reason: Reason) -> None:
    t = dataclasses.replace(failover.new(True, "test", 2), rung=R.ASLEEP)
    assert failover.fails_over(t, reason)[0]
    no, why = failover.fails_over(t, Reason.GPU_FAULT)
    assert not no and "gpu_fault" in why


def test_a_crash_wakes_the_spare_before_the_record_and_routes_to_it_then_back() -> None:
    m = SpareWorld()
    _ready(m)
    m.time_passes(3.0)
    m.world_is_kind(1)
    mark = _crash(m)
    acts = m.history[mark:]
    begin = _logs(acts, "restart.begin")[0]
    assert "spare wakes" in str(begin.fields["failover"])
    assert _index(acts, WakeSpare) < _index(acts, RecordIncident)
    record = acts[_index(acts, RecordIncident)]
    assert isinstance(record, RecordIncident)
    assert record.facts["failover"]["spare"] == "waking", "the record notes the failover"
    assert not [a for a in acts if isinstance(a, Route)], "routed before proven awake"
    assert _rung(m) == R.WAKING
    m.spare_answers(WakeSpare, SpareWoken(True, "", 0.7))
    acts = m.history[mark:]
    assert [a.to for a in acts if isinstance(a, Route)] == ["spare"]
    assert _logs(acts, "failover.served") and _rung(m) == R.SERVING
    assert failover.degraded(m.s.spare) == "degraded: spare serving"
    assert failover.who_serves(str(m.s.state), False, m.s.spare) == "spare"
    _ready(m)
    acts = m.history[mark:]
    assert [a.to for a in acts if isinstance(a, Route)] == ["spare", "full"]
    assert _logs(acts, "failover.returned")
    assert _rung(m) == R.ASLEEP, "re-armed at the full engine's READY"
    assert failover.who_serves(str(m.s.state), True, m.s.spare) == "full"


def test_no_room_beside_the_dying_tree_wakes_after_the_release() -> None:
    m = SpareWorld()
    _ready(m)
    m.time_passes(3.0)
    m.world_is_kind(1)
    mark = _crash(m)
    m.spare_answers(WakeSpare, SpareWoken(False, "3 GiB free", no_room=True))
    assert _rung(m) == R.ASLEEP and m.s.spare is not None and m.s.spare.late
    _ready(m)
    acts = m.history[mark:]
    wakes = [i for i, a in enumerate(acts) if isinstance(a, WakeSpare)]
    released = next(i for i, a in enumerate(acts) if isinstance(a, Log)
                    and a.event == "gpu.released")
    assert len(wakes) == 2 and wakes[1] > released
    assert [a.to for a in acts if isinstance(a, Route)] == ["spare", "full"]


def test_a_spare_that_cannot_wake_leaves_the_restart_as_today() -> None:
    m = SpareWorld()
    _ready(m)
    mark = _crash(m)
    m.spare_answers(WakeSpare, SpareWoken(False, "wake_up answered 500"))
    assert _logs(m.history[mark:], "failover.failed") and _rung(m) == R.DOWN
    assert not [a for a in m.history[mark:] if isinstance(a, Route)]
    _ready(m)  # relaunched as today, and the spare is rebuilt beside it
    acts = m.history[mark:]
    assert _index(acts, BuildSpare) > next(i for i, a in enumerate(acts) if isinstance(a, Log)
                                           and a.event == "child.ready")
    assert _rung(m) == R.ASLEEP


def test_failed_builds_turn_the_spare_off_until_a_reload() -> None:
    m = spare_climb()
    t = m.s.spare
    assert t is not None and t.rung == R.OFF and not t.wanted and "spare.retries" in t.why
    assert _logs(m.history, "spare.off")
    m._step(ReloadRequested(m.s.config))
    assert _rung(m) == R.BUILDING


@pytest.mark.parametrize("reason", sorted(r for r in Reason if REASONS[r].restart))
def test_every_restart_reason_wakes_the_spare_first_but_a_gpu_fault(reason: Reason) -> None:
    """Whatever found the fault (crash, hang, stall, memory rules, start timeout, SIGUSR1, a
    reload), the ladder's one entry wakes an armed spare before its record and take-down."""
    m = SpareWorld()
    _ready(m)
    s, acts = ladder.begin_restart(m.s, m.now + 1, reason, "test", drain=False)
    wakes = [a for a in acts if isinstance(a, WakeSpare)]
    if reason == Reason.GPU_FAULT:
        assert not wakes and s.spare is not None and s.spare.rung == R.ASLEEP
        return
    assert len(wakes) == 1 and s.spare is not None and s.spare.rung == R.WAKING
    later = [i for i, a in enumerate(acts) if isinstance(a, (RecordIncident, SignalGroup))]
    assert all(_index(acts, WakeSpare) < i for i in later)


def test_a_gpu_fault_never_fails_over() -> None:
    t = dataclasses.replace(failover.new(True, "test", 2), rung=R.ASLEEP)
    assert not failover.fails_over(t, Reason.GPU_FAULT)[0]


def test_room_is_decided_on_numbers_and_unknown_says_no() -> None:
    assert failover.room(30000.0, 27202.0, 1932.0)[0]
    assert not failover.room(20000.0, 27202.0, 1932.0)[0]
    assert not failover.room(None, 27202.0, 1932.0)[0]
    assert not failover.room(30000.0, None, None)[0]


def test_a_stop_is_honoured_on_every_rung_and_stops_the_spare() -> None:
    m = spare_climb()
    for key, (s, now) in m.seen.items():
        history: list[Action] = []
        s2, acts = machine.step(s, StopRequested("SIGTERM"), now)
        history += acts
        s2, t = run_to_exit(s2, now, history)
        assert s2.state in FINAL, f"a stop on {key} did not exit"
        assert t - now <= STOP_BOUND, f"a stop on {key} took {t - now:.1f}s"
        assert not [a for a in history if isinstance(a, (Spawn, BuildSpare, WakeSpare))], key
        assert [a for a in history if isinstance(a, StopSpare)], f"spare left on {key}"
        assert s2.spare is not None and s2.spare.rung == R.OFF
        check_one_way_out(history)


# ---- a reload that changes what vLLM runs (the spare serves what the serving engine does) ----

def _armed() -> SpareWorld:
    m = SpareWorld()
    _ready(m)
    assert _rung(m) == R.ASLEEP
    return m


def test_a_changed_command_stops_the_asleep_spare_and_rebuilds_it_at_the_new_ready() -> None:
    m = _armed()
    mark = len(m.history)
    m._step(ReloadRequested(OTHER))
    acts = m.history[mark:]
    rebuilt = _logs(acts, "spare.rebuilt")
    assert rebuilt and rebuilt[0].fields["why"] == "config reloaded: the vLLM command changed"
    begin = _logs(acts, "restart.begin")  # no failover to the spare of the old command
    assert _index(acts, StopSpare) < acts.index(begin[0])
    assert begin[0].fields["failover"] == "none: the spare is down"
    assert not [a for a in acts if isinstance(a, WakeSpare)]
    assert _rung(m) == R.DOWN
    _ready(m)  # the new serving engine is READY: the spare is built from the new config
    later = m.history[mark:]
    assert _index(later, BuildSpare) > max(i for i, a in enumerate(later) if isinstance(a, Log)
                                           and a.event == "child.ready")
    assert _rung(m) == R.ASLEEP and not m.s.spare.stale  # type: ignore[union-attr]


def test_the_same_command_leaves_the_spare_armed() -> None:
    m = _armed()
    pid = m.s.spare.pid  # type: ignore[union-attr]
    mark = len(m.history)
    m._step(ReloadRequested(CONFIG))
    assert not [a for a in m.history[mark:] if isinstance(a, (StopSpare, BuildSpare))]
    assert _rung(m) == R.ASLEEP and m.s.spare.pid == pid  # type: ignore[union-attr]


def test_a_changed_command_while_the_spare_serves_rebuilds_it_after_it_sleeps() -> None:
    m = _armed()
    m.time_passes(3.0)
    _crash(m)
    m.world_is_kind(1)
    assert _rung(m) in (R.SERVING, R.WAKING)
    m._step(ReloadRequested(OTHER))
    assert m.s.spare is not None and m.s.spare.stale  # it serves on until the full READY
    mark = len(m.history)
    _ready(m)
    acts = m.history[mark:]
    assert _index(acts, SleepSpare) < _index(acts, StopSpare) < _index(acts, BuildSpare)
    assert _rung(m) == R.ASLEEP and not m.s.spare.stale


def test_a_changed_command_during_the_first_build_launches_then_rebuilds() -> None:
    m = SpareWorld()
    m._step(ReloadRequested(CONFIG))  # starts the world: the first build is out
    for _ in range(10):
        if m.spare_out:
            break
        m.world_is_kind(1) if m.outstanding else m.time_passes(1.0)
    assert _rung(m) == R.BUILDING and m.s.restart.phase == Phase.SPARE_BUILD
    m._step(ReloadRequested(OTHER))
    mark = len(m.history)
    m.spare_answers(BuildSpare, m.kind_spare(BuildSpare(1.0)))
    acts = m.history[mark:]
    assert [a for a in acts if isinstance(a, StopSpare)] and [a for a in acts
                                                              if isinstance(a, Spawn)]
    assert _rung(m) == R.DOWN
    _ready(m)
    assert _rung(m) == R.ASLEEP and m.s.config is OTHER


def test_spare_enabled_false_turns_it_off_and_a_later_reload_back_on() -> None:
    m = _armed()
    m._step(ReloadRequested(SPARE_OFF))
    assert _rung(m) == R.OFF and m.s.spare is not None and not m.s.spare.wanted
    assert [a for a in m.history if isinstance(a, StopSpare)]
    m._step(ReloadRequested(CONFIG))
    assert _rung(m) == R.BUILDING


def _first_build_out() -> SpareWorld:
    m = SpareWorld()
    m.first_build_out(CONFIG)
    assert _rung(m) == R.BUILDING and m.s.restart.phase == Phase.SPARE_BUILD
    return m


@pytest.mark.parametrize("answer", ["failed", "built", "never"])
def test_spare_enabled_false_during_the_first_build_launches_the_full_engine(
        answer: str) -> None:
    """The reload turns the spare off while the first start waits on its build: the full
    engine launches at once (not when, or if, the stopped build answers), and the build's
    late answer changes nothing."""
    m = _first_build_out()
    build = m.s.spare.build if m.s.spare else 0
    mark = len(m.history)
    m._step(ReloadRequested(SPARE_OFF))
    acts = m.history[mark:]
    assert _index(acts, StopSpare) < _index(acts, Spawn)
    assert m.s.restart.phase == Phase.LAUNCHING and _rung(m) == R.OFF
    assert m.s.spare is not None and "enabled = false" in m.s.spare.why
    if answer != "never":
        late = SpareBuilt(answer == "built", "" if answer == "built" else "stopped", 7001,
                          27202.0, 1932.0, build=build)
        m.spare_answers(BuildSpare, late)
    _ready(m)
    assert _rung(m) == R.OFF and sum(isinstance(a, Spawn) for a in m.history) == 1


@pytest.mark.parametrize("fault", ["crash", "sigusr1"])
def test_a_restart_during_the_spares_rebuild_stops_it_and_builds_it_at_the_next_ready(
        fault: str) -> None:
    """The spare died asleep and is rebuilt beside the READY engine; the serving engine
    fails meanwhile: the rebuild stops before the relaunch (never two engines starting side
    by side), restart.begin says so, and the spare is built again at the next READY."""
    m = _armed()
    assert m.s.spare is not None and m.s.spare.pid is not None
    m._step(SpareExited(m.s.spare.pid, "SIGKILL"))
    assert _rung(m) == R.BUILDING
    build = m.s.spare.build
    mark = len(m.history)
    if fault == "crash":
        _crash(m)
    else:
        m._step(ladder_sigusr1())
    acts = m.history[mark:]
    assert _rung(m) == R.DOWN and [a for a in acts if isinstance(a, StopSpare)]
    begin = _logs(acts, "restart.begin")
    assert begin and "being rebuilt" in str(begin[0].fields["failover"])
    # the stopped build's own answer comes in late: nothing of it may stay
    m.spare_answers(BuildSpare, SpareBuilt(False, "exited during its start", build=build))
    mark = len(m.history)
    _ready(m)
    acts = m.history[mark:]
    assert _index(acts, Spawn) < _index(acts, BuildSpare)
    assert _rung(m) == R.ASLEEP and m.s.spare.build > build


def ladder_sigusr1() -> Event:
    from vllmwatch.core.events import RestartRequested

    return RestartRequested()


def test_a_spare_turned_back_on_forgets_why_it_was_off() -> None:
    m = _armed()
    m._step(ReloadRequested(SPARE_OFF))
    assert m.s.spare is not None and "enabled = false" in m.s.spare.why
    m._step(ReloadRequested(CONFIG))
    assert _rung(m) == R.BUILDING and m.s.spare.why == ""
    m.spare_answers(BuildSpare, m.kind_spare(BuildSpare(1.0)))
    assert _rung(m) == R.ASLEEP and m.s.spare.why == ""


@pytest.mark.parametrize("fault", ["crash", "sigusr1"])
def test_failure_restarts_during_rebuilds_count_against_spare_retries(fault: str) -> None:
    """A rebuild may be what fails the serving engine (the host's OOM killer on the spare's
    pinned weights, a memory spike at its start): each failure restart during a rebuild
    counts as a failed build, so `spare.retries` of them in a row turn the spare off (before,
    they never counted: the same rebuild began at every READY until the crash-loop guard
    gave up). A planned restart (SIGUSR1) during a rebuild says nothing about the spare."""
    m = _armed()
    assert m.s.spare is not None and m.s.spare.pid is not None
    m._step(SpareExited(m.s.spare.pid, "SIGKILL"))
    for cycle in range(1, 4):
        assert _rung(m) == R.BUILDING, (cycle, _rung(m))
        if fault == "crash":
            _crash(m)
        else:
            m._step(ladder_sigusr1())
        if fault == "crash" and cycle == m.s.spare.retries:
            break
        for _ in range(80):  # relaunch and READY; the rebuild begins and is left unanswered
            if m.s.state == S.READY and m.s.restart.phase == Phase.IDLE:
                break
            if m.outstanding:
                m.world_is_kind(1)
            else:
                m.time_passes(5.0)
    off = _logs(m.history, "spare.off")
    if fault == "crash":
        assert _rung(m) == R.OFF and not m.s.spare.wanted and len(off) == 1, _rung(m)
        assert "2 failed builds" in m.s.spare.why and "restart (crash)" in str(
            off[0].fields["last_error"]), off
    else:
        assert not off and _rung(m) == R.BUILDING and m.s.spare.failed_builds == 0


def test_status_says_why_a_spare_is_down_not_why_it_was_planned_on() -> None:
    """/status and `vllmwatch status` print the track's why for a spare down; no move to
    DOWN set it, so a spare whose wake failed read `down, build 1: spare.enabled = true`."""
    from vllmwatch.core.failover import SpareWoken, WakeSpare
    from vllmwatch.status.statusline import _spare as status_spare
    from vllmwatch.status.view import _spare_rows

    m = _armed()
    _crash(m)
    m.spare_answers(WakeSpare, SpareWoken(False, "/wake_up answered 500 CUDA out of memory"))
    assert _rung(m) == R.DOWN
    [_, (_, line)] = _spare_rows({"spare": status_spare(m.s, m.now, 0.0), "serving": "nobody"})
    assert line.startswith("down") and "wake failed: /wake_up answered 500" in line, line
    _ready(m)  # rebuilt and asleep again: the plan's words are back
    assert m.s.spare is not None and _rung(m) == R.ASLEEP
    assert (status_spare(m.s, m.now, 0.0) or {})["why"] == m.s.spare.why


# ---- a fault while the spare goes back to sleep (RETURNING) ----

def _returning() -> tuple[SpareWorld, int]:
    """A failover and the full engine READY again: the spare drains to sleep (its SleepSpare
    not answered yet); the time since the last failure is past the backoff's reset."""
    m = SpareWorld()
    _ready(m)
    m.time_passes(3.0)
    m.world_is_kind(1)
    _crash(m)
    m.spare_answers(WakeSpare, SpareWoken(True, "", 0.7))
    for _ in range(80):  # the full engine's relaunch: everything answered but the sleep
        if _rung(m) == R.RETURNING:
            break
        CoreMachine.world_is_kind(m, 1) if m.outstanding else m.time_passes(5.0)
    assert _rung(m) == R.RETURNING and [type(a) for a in m.spare_out] == [SleepSpare]
    m.time_passes(70.0)
    return m, _crash(m)


def test_a_crash_while_the_spare_returns_fails_over_once_it_sleeps() -> None:
    """The full engine back from a failover dies while the spare drains to sleep: the spare
    is woken again as soon as it sleeps (a wake from asleep is the path that is proven), and
    serves until the next READY. Before, the restart went on with nobody serving."""
    m, mark = _returning()
    acts = m.history[mark:]
    begin = _logs(acts, "restart.begin")[0]
    assert "wakes again as soon as it sleeps" in str(begin.fields["failover"])
    assert _logs(acts, "failover.begin")[0].fields["deferred"]
    assert not [a for a in acts if isinstance(a, WakeSpare)], "woken while awake"
    m.spare_answers(SleepSpare, SpareSlept(True, "", 0.36))
    assert _rung(m) == R.WAKING and [type(a) for a in m.spare_out] == [WakeSpare]
    m.spare_answers(WakeSpare, SpareWoken(True, "", 0.5))
    acts = m.history[mark:]
    assert [a.to for a in acts if isinstance(a, Route)] == ["spare"]
    assert _rung(m) == R.SERVING and _logs(acts, "failover.served")
    _ready(m)
    assert [a.to for a in m.history[mark:] if isinstance(a, Route)] == ["spare", "full"]
    assert _rung(m) == R.ASLEEP


def _begins_open(m: SpareWorld) -> int:
    said = [a.event for a in m.history if isinstance(a, Log)]
    return said.count("failover.begin") - sum(said.count(e) for e in (
        "failover.served", "failover.failed", "failover.overtaken"))


@pytest.mark.parametrize("answer", ["sleeps", "no_room"])
def test_a_restart_while_a_failover_is_under_way_joins_it(answer: str) -> None:
    """The relaunch dies again while a failover waits (deferred until the spare sleeps, or
    asleep until the dying tree's GPU release): that restart joins the failover under way.
    One failover.begin, answered once, one wake at a time. CI's walk (stop of 2026-12-07):
    each such restart said failover.begin again and `journalctl -g failover` showed begins
    that no line ever answered."""
    m, mark = _returning()
    if answer == "no_room":  # asleep, its wake deferred to the release of the old tree
        m.spare_answers(SleepSpare, SpareSlept(True, "", 0.36))
        m.spare_answers(WakeSpare, SpareWoken(False, "no room", no_room=True))
        assert _rung(m) == R.ASLEEP and m.s.spare is not None and m.s.spare.late
    began = m.s.spare.began if m.s.spare is not None else None
    assert began is not None and _begins_open(m) == 1
    for _ in range(80):  # the relaunch is spawned, and dies before it is READY
        if m.s.child is not None and m.s.child.pid in m.alive and m.s.state == S.STARTING:
            break
        CoreMachine.world_is_kind(m, 1) if m.outstanding else m.time_passes(5.0)
    assert _rung(m) in (R.RETURNING, R.ASLEEP, R.WAKING), _rung(m)
    again = _crash(m)
    acts = m.history[again:]
    assert not _logs(acts, "failover.begin") and _begins_open(m) == 1
    assert "goes on" in str(_logs(acts, "restart.begin")[0].fields["failover"])
    assert m.s.spare is not None and m.s.spare.began == began  # clients' wait since the first
    _ready(m)
    assert _begins_open(m) == 0
    wakes = [i for i, a in enumerate(m.history[mark:]) if isinstance(a, WakeSpare)]
    assert len(wakes) <= 2, "woken more than once per failover and its one deferral"


def test_no_room_for_the_wake_after_the_return_waits_for_the_release() -> None:
    """The relaunched engine dies while the spare drains back to sleep; woken once asleep,
    NVML shows no room beside the dying tree (a leak restart's case). That wake is a first
    wake like any other: deferred to the old tree's GPU release (failover.deferred), not
    given up (failover.failed, nobody serving the whole relaunch). Review of 2026-12-05."""
    m, mark = _returning()
    m.spare_answers(SleepSpare, SpareSlept(True, "", 0.36))
    assert _rung(m) == R.WAKING
    m.spare_answers(WakeSpare, SpareWoken(False, "3 GiB free beside the old tree",
                                          no_room=True))
    acts = m.history[mark:]
    assert _logs(acts, "failover.deferred") and not _logs(acts, "failover.failed")
    assert _rung(m) == R.ASLEEP
    _ready(m)  # the release wakes it; it serves until the relaunch's READY
    acts = m.history[mark:]
    assert len([a for a in acts if isinstance(a, WakeSpare)]) == 2
    assert [a.to for a in acts if isinstance(a, Route)] == ["spare", "full"]


def test_no_room_again_after_the_release_gives_the_failover_up_once() -> None:
    """The second wake, after the release, finding no room either: failed, armed again; never
    a third wake."""
    m, mark = _returning()
    m.spare_answers(SleepSpare, SpareSlept(True, "", 0.36))
    no_room = SpareWoken(False, "no room", no_room=True)
    m.spare_answers(WakeSpare, no_room)
    for _ in range(80):  # to the release: the deferred wake goes out
        if m.spare_out:
            break
        CoreMachine.world_is_kind(m, 1) if m.outstanding else m.time_passes(5.0)
    m.spare_answers(WakeSpare, no_room)
    acts = m.history[mark:]
    assert len(_logs(acts, "failover.failed")) == 1 and _rung(m) == R.ASLEEP
    _ready(m)
    assert len([a for a in m.history[mark:] if isinstance(a, WakeSpare)]) == 2


def test_a_relaunch_ready_before_the_spare_sleeps_leaves_it_asleep() -> None:
    m, mark = _returning()
    for _ in range(80):  # the relaunch reaches READY while the sleep is still out
        if m.s.state == S.READY and m.s.restart.phase == Phase.IDLE:
            break
        CoreMachine.world_is_kind(m, 1) if m.outstanding else m.time_passes(5.0)
    assert m.s.state == S.READY and _rung(m) == R.RETURNING
    m.spare_answers(SleepSpare, SpareSlept(True, "", 0.36))
    assert _rung(m) == R.ASLEEP and not m.spare_out
    assert not m.s.spare.late and m.s.spare.began is None  # type: ignore[union-attr]
    assert not [a for a in m.history[mark:] if isinstance(a, Route)]


# ---- a launch that waits for a stopped spare's tree to be gone (stopping.launch_waits) ----

def launch_waits() -> tuple[SpareWorld, int]:
    """The first start after a reload turned the spare off during its build: the launch
    finds the stopped build's tree still going down."""
    m = _first_build_out()
    m.launch_waiting = True
    mark = len(m.history)
    m._step(ReloadRequested(SPARE_OFF))
    return m, mark


def test_a_launch_beside_a_spare_going_down_waits_as_a_rung_and_goes_once_it_is_gone() -> None:
    """The shell waited on the loop's thread (no SIGHUP, SIGUSR1 nor WATCHDOG=1 answered for
    up to 15 s): the wait is the core's now, a rung with a deadline, every event answered."""
    m, mark = launch_waits()
    acts = m.history[mark:]
    assert m.s.state == S.BACKOFF and m.s.restart.phase == Phase.LAUNCH_WAIT, m.s.state
    assert m.s.deadline is not None and _logs(acts, "launch.waits")
    assert m.s.gen == 0 and not m.alive, "nothing launched, no generation spent"
    mark = len(m.history)
    m._step(ReloadRequested(SPARE_OFF))  # SIGHUP: answered now
    assert _logs(m.history[mark:], "config.reloaded")
    mark = len(m.history)
    m._step(RestartRequested())  # SIGUSR1: the launch is asked again, and waits again
    assert _logs(m.history[mark:], "launch.waits")
    m.time_passes(LAUNCH_WAIT)  # no LaunchMayGo came by the rung's deadline: asked again
    assert m.s.restart.phase == Phase.LAUNCH_WAIT and m.s.gen == 0
    m.launch_waits(False)  # LaunchMayGo: the launch goes
    assert m.s.state == S.STARTING and m.s.gen == 1 and m.alive
    m._step(LaunchMayGo())  # a second watcher's: nothing more
    assert sum(isinstance(a, Spawned) for a in m.answers) == 0 and len(m.alive) == 1
    _ready(m)


def test_a_stop_while_a_launch_waits_for_the_spare_leaves_at_once_and_launches_nothing() -> None:
    m, _ = launch_waits()
    assert m.s.restart.phase == Phase.LAUNCH_WAIT
    s, now, history = m.s, m.now, []
    s, acts = machine.step(s, StopRequested("SIGTERM"), now)
    history += acts
    s, t = run_to_exit(s, now, history)
    assert s.state in FINAL and t - now <= STOP_BOUND
    assert not [a for a in history if isinstance(a, Spawn)]
    check_one_way_out(history)
    s, acts = machine.step(s, LaunchMayGo(), t)  # the spare's end after the exit: nothing
    assert not acts
