"""Properties of the pure core, checked with hypothesis's stateful testing.

Random sequences of events, signals, worker results (answered, failed or never) and time
jumps are fed to `step`; after every step these must hold:
- step never raises (a TransitionError or PhaseError would be a bug in a table or the ladder);
- the restart ladder's rung agrees with the coarse state (restart.COARSE), and every rung
  bounded by a deadline has one (restart.BOUND);
- at most one child: a Spawn is never emitted while an earlier child may still be alive
  (every spawned child was reaped, killed or swept first);
- from ANY reachable state, a stop request reaches Exit within
  stop_timeout + KILL_WAIT + SWEEP_WAIT of fake time, even if no worker ever answers again;
- while READY, every probe kind the core started either comes back or shows up as stale;
- one way out (ladder.halt): every path to Exit, whichever of the exits the world provokes
  (stop, crash-loop 3, vLLM refusing its arguments 2, a fatal launch error 2, a foreign port
  holder 4, repeated start memory failures 5, a fatal GPU fault 6, a failed required
  prewarm 1), logs `daemon.exiting` exactly once, with the code Exit carries, and sends
  STOPPING=1 before Exit; no exit logs `restart.begin` after its `daemon.exiting`;
- the restarts counted by reason (status, /metrics, the record) are the `restart.begin`
  lines, by reason (a crash-loop give-up begins no restart and counts in none);
- the config exit (78) for a launch that cannot exec or exits 2 at start is only ever the
  verdict on a [vllm] section that never reached READY: once one did, the same failure is
  a restart the crash-loop guard counts (an upgrade under way, core/launchfail.py).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from vllmwatch.config.schema import Config, from_dict
from vllmwatch.core import exitcodes, machine, probing
from vllmwatch.core.actions import (
    Action,
    AsyncAction,
    CheckRelease,
    DoPrewarm,
    Exit,
    Log,
    Notify,
    Probe,
    RecordIncident,
    SampleMemory,
    SignalGroup,
    Smoke,
    Spawn,
    Sweep,
    failure_result,
)
from vllmwatch.core.events import (
    CanaryResult,
    ChildExited,
    ChildOutput,
    Event,
    HealthResult,
    IncidentRecorded,
    LaunchMayGo,
    LaunchWaits,
    MemorySampled,
    MetricsResult,
    PrewarmDone,
    ReleaseChecked,
    ReloadRequested,
    RestartRequested,
    SmokeResult,
    Spawned,
    SpawnFailed,
    StopRequested,
    SweepDone,
    Tick,
)
from vllmwatch.core.names import Reason
from vllmwatch.core.restart import BOUND, COARSE, Phase
from vllmwatch.core.samples import GpuFault, MemorySample
from vllmwatch.core.state import FINAL, S, WatchState
from vllmwatch.core.stopping import KILL_WAIT, SWEEP_WAIT

CONFIG = from_dict({
    "vllm": {"model": "/m", "gpus": [0]},
    "startup": {"timeout": 120, "stall_timeout": 60},
    "probe": {"interval": 2, "timeout": 1, "failure_threshold": 2, "canary_interval": 5,
              "canary_timeout": 3, "metrics_interval": 3, "stall_timeout": 30},
    "restart": {"backoff_initial": 1, "backoff_max": 10, "max_restarts": 4, "window": 300,
                "drain_timeout": 10, "stop_timeout": 8, "stable_after": 60,
                "gpu_release_timeout": 6},
    "prewarm": {"enabled": True},
    "memory": {"sample_interval": 2, "pss_interval": 4, "gpu_limit": 1000},
    # A check before READY: its answer may land in any state (after the start it belonged
    # to was taken down too: it was judged during the incident record and raised PhaseError)
    "smoke": [{"endpoint": "chat", "required": False}],
})
OTHER = dataclasses.replace(CONFIG, vllm=dataclasses.replace(CONFIG.vllm, port=8001))
STOP_BOUND = CONFIG.restart.stop_timeout + KILL_WAIT + SWEEP_WAIT + 0.01
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def check_one_way_out(acts: list[Action]) -> None:
    """The whole action history of one run: if it exits, it went through ladder.halt."""
    exits = [i for i, a in enumerate(acts) if isinstance(a, Exit)]
    exiting = [i for i, a in enumerate(acts) if isinstance(a, Log) and a.event == "daemon.exiting"]
    assert len(exiting) <= 1, "daemon.exiting logged more than once"
    assert len(exits) <= 1, "more than one Exit"
    if not exits:
        return
    assert exiting and exiting[0] < exits[0], "Exit without daemon.exiting before it"
    log, done = acts[exiting[0]], acts[exits[0]]
    assert isinstance(log, Log) and isinstance(done, Exit)
    assert log.fields["code"] == done.code, "daemon.exiting names another code than Exit"
    stopping = [i for i, a in enumerate(acts) if isinstance(a, Notify) and a.stopping]
    assert stopping and stopping[0] < exits[0], "Exit without STOPPING=1 before it"
    later = acts[exiting[0]:]
    assert not any(isinstance(a, Log) and a.event == "restart.begin" for a in later)


def _success(action: AsyncAction, gpu: float) -> Event:
    """What a healthy world answers."""
    if isinstance(action, Probe):
        if action.kind == "health":
            return HealthResult(True, 200, 0.01, gen=action.gen)
        if action.kind == "metrics":
            return MetricsResult(True, 0.01, 0.0, 0.0, 0.1, 1.0, 1.0, gen=action.gen)
        return CanaryResult(True, False, 0.01, warmup=action.kind == "warmup", gen=action.gen)
    if isinstance(action, SampleMemory):
        sample = MemorySample("nvml-process", (1,), gpu, host_rss_mib=100.0)
        return MemorySampled(sample, 0, action.gen)
    if isinstance(action, Sweep):
        return SweepDone((), (), None)
    if isinstance(action, CheckRelease):
        return ReleaseChecked(True, "ok")
    if isinstance(action, RecordIncident):
        return IncidentRecorded(action.seq, f"i-{action.seq}", f"/i/{action.seq}")
    if isinstance(action, Smoke):
        return SmokeResult(action.index, True, 0.01, gen=action.gen)
    assert isinstance(action, DoPrewarm)
    return PrewarmDone(True)


def _hostile(action: AsyncAction, gpu: float) -> Event:
    """The worse answers: a foreign port holder, a fatal GPU fault, a failed prewarm."""
    if isinstance(action, Sweep):
        return SweepDone((), (), "pid 77 (nginx)")
    if isinstance(action, SampleMemory):
        sample = MemorySample("nvml-process", (1,), gpu, host_rss_mib=100.0,
                              gpu_faults=(GpuFault(0, "gpu_lost"),))
        return MemorySampled(sample, 0, action.gen)
    if isinstance(action, DoPrewarm):
        return PrewarmDone(False, "a required step failed")
    return failure_result(action, "boom")


def run_to_exit(s: WatchState, now: float, history: list[Action] | None = None
                ) -> tuple[WatchState, float]:
    """Drive the core with Ticks only (no worker ever answers) until it exits or time runs
    out well past the bound; the actions go to `history`."""
    limit = now + 10 * STOP_BOUND
    while s.state not in FINAL and now < limit:
        due = machine.next_wakeup(s)
        now = max(now + 0.001, due if due is not None else now + 1.0)
        s, acts = machine.step(s, Tick(), now)
        if history is not None:
            history += acts
        if any(isinstance(a, Exit) for a in acts):
            break
    return s, now


class CoreMachine(RuleBasedStateMachine):
    """The core against an adversarial world."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.s = machine.initial(CONFIG, self.now, seed=7)
        self.outstanding: list[AsyncAction] = []
        self.spawn_ok = True
        self.answers = []
        self.alive: set[int] = set()  # children that may be alive
        self.next_pid = 100
        self.gpu = 100.0
        self.exited = False
        self.history: list[Action] = []  # every action of this run, in order
        self.ready_vllm: object = None  # the [vllm] of the last READY seen (an oracle)
        self.launch_waiting = False  # the shell answers a Spawn LaunchWaits (nothing launched)
        self._step(Tick())

    # ---- plumbing ----

    def _step(self, ev: Event) -> None:
        # The shell answers a Spawn synchronously, before any other event (the contract of
        # events.Spawn; Loop._turn does so): its answer is stepped right after.
        queue = [ev]
        while queue and not self.exited:
            self.s, acts = machine.step(self.s, queue.pop(0), self.now)
            self.history += acts
            if self.s.state == S.READY and self.s.child is not None:
                self.ready_vllm = self.s.child.vllm
            self.answers: list[Event] = []
            for a in acts:
                self._effect(a)
            queue = self.answers + queue

    def _launch(self) -> Event:
        if not self.spawn_ok:
            return SpawnFailed("no such file", fatal=getattr(self, "spawn_fatal", False),
                               called_off=getattr(self, "spawn_called_off", False))
        pid = self.next_pid
        self.next_pid += 1
        self.alive.add(pid)
        return Spawned(pid)

    def _effect(self, a: Action) -> None:
        if isinstance(a, Spawn):
            assert not self.alive, f"Spawn while children {self.alive} may be alive"
            if self.launch_waiting:  # a stopped spare's tree, the version read: not yet
                self.answers.append(LaunchWaits("test"))
                return
            answer = self._launch()
            self.answers.append(answer)
            if isinstance(answer, SpawnFailed) and answer.called_off:
                # the shell calls a launch off only for a stop that waits: it comes next
                self.answers.append(StopRequested("SIGTERM"))
        elif isinstance(a, (Probe, SampleMemory, Sweep, CheckRelease, DoPrewarm,
                            RecordIncident, Smoke)):
            self.outstanding.append(a)
        elif isinstance(a, SignalGroup) and a.signal == "SIGKILL":
            self.alive.clear()  # SIGKILL to the group always works in this world
        elif isinstance(a, Exit):
            self.exited = True

    # ---- rules: time, signals, the child, worker results ----

    @rule(dt=st.floats(min_value=0.0, max_value=40.0))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self._step(Tick())

    @rule(sig=st.sampled_from(["SIGTERM", "SIGINT"]))
    def stop(self, sig: str) -> None:
        self._step(StopRequested(sig))

    @rule()
    def restart(self) -> None:
        self._step(RestartRequested())

    @rule(which=st.sampled_from(["same", "other", "invalid"]))
    def reload(self, which: str) -> None:
        config: Config | None = {"same": CONFIG, "other": OTHER, "invalid": None}[which]
        self._step(ReloadRequested(config, "" if config else "bad"))

    @rule(how=st.sampled_from(["ok", "fails", "fatal", "called_off"]))
    def next_launch_works(self, how: str) -> None:
        self.spawn_ok = how == "ok"
        self.spawn_fatal = how == "fatal"
        self.spawn_called_off = how == "called_off"

    @rule(waiting=st.booleans())
    def launch_waits(self, waiting: bool) -> None:
        """What a launch must wait for is under way (a Spawn is answered LaunchWaits), or has
        come (LaunchMayGo, as the shell posts it; also when no launch waited)."""
        self.launch_waiting = waiting
        if not waiting:
            self._step(LaunchMayGo())

    @precondition(lambda self: bool(self.alive))
    @rule(code=st.sampled_from([0, 1, 2, None]), oom=st.booleans())
    def child_dies(self, code: int | None, oom: bool) -> None:
        pid = max(self.alive)
        self.alive.discard(pid)
        self._step(ChildExited(pid, code, None if code is not None else "SIGKILL",
                               memory_lines=(OOM,) if oom else ()))

    @rule(milestone=st.sampled_from([None, "weights", "graphs"]),
          told=st.sampled_from(["", "", "[shutdown] API server: shutdown triggered"]),
          older=st.booleans())
    def child_prints(self, milestone: str | None, told: str, older: bool) -> None:
        # told: vLLM says an outside signal started its shutdown (core/serving.py _told), by
        # the live child or an older one's late line
        pid = max(self.alive, default=0) - older
        self._step(ChildOutput(milestone, told_to_stop=told, pid=pid) if told
                   else ChildOutput(milestone))

    @precondition(lambda self: bool(self.outstanding))
    @rule(data=st.data(), how=st.sampled_from(["ok", "fail", "lost", "hostile"]))
    def worker_answers(self, data: st.DataObject, how: str) -> None:
        i = data.draw(st.integers(0, len(self.outstanding) - 1))
        action = self.outstanding.pop(i)
        if isinstance(action, Sweep):
            self.alive.clear()  # the sweep kills what is left of our tree
        if how == "hostile":  # the answers that end supervision
            self._step(_hostile(action, self.gpu))
        elif how == "ok":
            self._step(_success(action, self.gpu))
        elif how == "fail":
            self._step(failure_result(action, "boom"))
        # "lost": a worker that never answers (the freshness guard must see it)

    @precondition(lambda self: bool(self.outstanding))
    @rule(turns=st.integers(1, 6))
    def world_is_kind(self, turns: int) -> None:
        # Answer everything that is out, a few rounds: the way to READY (and past it) in few
        # steps, so that the exits only a READY child meets (GPU fault) are explored too.
        for _ in range(turns):
            out, self.outstanding = self.outstanding, []
            for action in out:
                if isinstance(action, Sweep):
                    self.alive.clear()
                self._step(_success(action, self.gpu))
            self.now += 1.0
            self._step(Tick())

    @rule(mib=st.floats(min_value=0.0, max_value=3000.0))
    def gpu_memory_moves(self, mib: float) -> None:
        self.gpu = mib

    # ---- invariants ----

    @invariant()
    def stop_always_exits_in_time(self) -> None:
        if self.exited:
            return
        t0 = self.now
        s, acts = machine.step(self.s, StopRequested("SIGTERM"), t0)
        history = [*self.history, *acts]
        s, t = run_to_exit(s, t0, history)
        assert s.state in FINAL, f"stop from {self.s.state} did not exit"
        assert t - t0 <= STOP_BOUND, f"stop from {self.s.state} took {t - t0:.1f}s"
        check_one_way_out(history)
        # leaving nothing: a child that may be alive gets the group's SIGKILL or the sweep
        # (which kills what is left of the tree) before Exit, even if no worker answers
        if self.alive:
            ends = history[len(self.history):]
            assert any(isinstance(a, Sweep) or (isinstance(a, SignalGroup) and a.signal ==
                       "SIGKILL" and not a.leader) for a in ends), \
                f"stop from {self.s.state} left child {self.alive}"

    @invariant()
    def every_exit_goes_through_halt(self) -> None:
        check_one_way_out(self.history)
        s = self.s
        if s.exit_reason is not None:
            event(f"exit {s.exit_reason}")  # --hypothesis-show-statistics: exits reached
        assert (s.exit_code is None) == (s.exit_reason is None)
        if not self.exited and s.exit_code is not None:  # leaving: it still gets there
            history = list(self.history)
            s, _ = run_to_exit(s, self.now, history)
            assert s.state in FINAL, f"an exit from {self.s.state} never reached Exit"
            check_one_way_out(history)

    @invariant()
    def restarts_count_the_restart_begin_lines(self) -> None:
        # What status, /metrics and the record call restarts (restarts_by_reason) is the
        # restart.begin lines of the journal, by reason: a crash-loop give-up begins none
        begun = Counter(str(a.fields["reason"]) for a in self.history
                        if isinstance(a, Log) and a.event == "restart.begin")
        counted = {str(k): n for k, n in self.s.restarts_by_reason.items() if n}
        assert counted == dict(begun), (counted, begun)

    @invariant()
    def config_exit_only_for_a_command_never_ready(self) -> None:
        # A launch of the [vllm] that last reached READY failing "fatally" (no such file, exit
        # 2 at start) is an upgrade under way: retried, never the final 78.
        s = self.s
        if s.exit_reason == Reason.CONFIG:
            assert s.child is not None and s.child.vllm != self.ready_vllm, \
                "exit 78 for the vLLM command that ran"

    @invariant()
    def every_rung_shows_and_is_bounded(self) -> None:
        # The restart ladder (core/restart.py): the rung agrees with the coarse state, and a
        # rung bounded by a deadline has one (a stop from each: stop_always_exits_in_time).
        s = self.s
        if self.exited or s.state in FINAL:
            return
        event(f"rung {s.restart.phase}")  # --hypothesis-show-statistics: rungs reached
        assert str(s.state) in COARSE[s.restart.phase], (s.restart.phase, s.state)
        if BOUND[s.restart.phase] == "deadline":
            assert s.deadline is not None, f"{s.restart.phase} without a deadline"
        if BOUND[s.restart.phase] == "gate":
            assert s.restart.gate is not None

    @invariant()
    def ready_probes_are_fresh_or_flagged(self) -> None:
        c = self.s.child
        # A restart's record written from READY judges nothing (machine._due): the restart
        # is decided and the record's deadline bounds the wait (every_rung_shows_and_is_
        # bounded); flagging a dying child's probes stale then would be a false alarm.
        if self.s.state != S.READY or c is None or self.s.restart.phase == Phase.RECORDING:
            return
        for kind, bound in probing.bounds(self.s).items():
            last = c.probes.done_at.get(kind, self.s.since)
            if self.now - last > bound + 0.01 and machine.next_wakeup(self.s) is not None:
                # overdue: the next step must flag it (a Tick at now is due)
                s2, _ = machine.step(self.s, Tick(), self.now)
                assert s2.state != S.READY or kind in (s2.child.probes.stale if s2.child else ())

    @invariant()
    def wakeup_is_never_in_a_loop(self) -> None:
        # A deadline in the past that a Tick does not move would spin the loop at 100 % CPU.
        due = machine.next_wakeup(self.s)
        if due is not None and due <= self.now and not self.exited:
            s2, _ = machine.step(self.s, Tick(), self.now)
            due2 = machine.next_wakeup(s2)
            assert due2 is None or due2 > self.now or s2.state in FINAL, \
                f"next_wakeup stuck at {due2} <= now in {s2.state}"


CoreMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestCore = CoreMachine.TestCase


# ---- each exit, provoked on purpose: the random walk above rarely reaches some of them ----

def _answer(m: CoreMachine, kind: type, event: Event) -> None:
    """Answer the first outstanding action of `kind` with `event`."""
    i = next(i for i, a in enumerate(m.outstanding) if isinstance(a, kind))
    action = m.outstanding.pop(i)
    if isinstance(action, Sweep):
        m.alive.clear()
    m._step(event)


def _ready(m: CoreMachine) -> None:
    for _ in range(20):
        if m.s.state == S.READY:
            return
        m.world_is_kind(1)
    raise AssertionError(f"never READY: {m.s.state}")


def _leave(m: CoreMachine) -> None:
    """Let the exit under way finish, answering what it asks, then check the one way out."""
    for _ in range(50):
        if m.exited:
            break
        if m.outstanding:
            m.world_is_kind(1)
        else:
            m.time_passes(5.0)
    assert m.exited and m.s.state in FINAL
    check_one_way_out(m.history)


def _start_fails(m: CoreMachine, code: int, oom: bool = False) -> None:
    """Let a launch happen, then the child dies while STARTING."""
    for _ in range(20):
        if m.s.state == S.STARTING and m.alive:
            m.child_dies(code, oom)
            return
        if m.outstanding:
            m.world_is_kind(1)
        else:
            m.time_passes(5.0)
    raise AssertionError(f"no launch: {m.s.state}")


def _stop(m: CoreMachine) -> None:
    _ready(m)
    m.stop("SIGTERM")


def _crash_loop(m: CoreMachine) -> None:
    for _ in range(CONFIG.restart.max_restarts + 1):
        if m.s.exit_code is not None:
            return
        _start_fails(m, 1)


def _rejected(m: CoreMachine) -> None:
    _start_fails(m, 2)


def _fatal_launch(m: CoreMachine) -> None:
    m.next_launch_works("fatal")
    m.world_is_kind(3)


def _fatal_after_ready(m: CoreMachine) -> None:
    """The command that ran cannot exec any more, ever: the guard's 75, never the 78."""
    _ready(m)
    m.next_launch_works("fatal")
    m.child_dies(0, False)


def _called_off(m: CoreMachine) -> None:
    m.next_launch_works("called_off")  # a stop came while the launch waited (the shell)
    m.world_is_kind(3)


def _port_busy(m: CoreMachine) -> None:
    _answer(m, Sweep, _hostile(Sweep(None, "", 0), 0.0))


def _start_memory(m: CoreMachine) -> None:
    for _ in range(CONFIG.memory.start_memory_retries + 1):
        if m.s.exit_code is not None:
            return
        _start_fails(m, 1, oom=True)


def _gpu_fault(m: CoreMachine) -> None:
    _ready(m)
    m.time_passes(CONFIG.memory.sample_interval)
    action = next(a for a in m.outstanding if isinstance(a, SampleMemory))
    _answer(m, SampleMemory, _hostile(action, 0.0))


def _prewarm_fails(m: CoreMachine) -> None:
    m.world_is_kind(1)  # the first sweep: then the prewarm is out
    _answer(m, DoPrewarm, PrewarmDone(False, "a required step failed"))


@pytest.mark.parametrize(("provoke", "code", "reason"), [
    (_stop, exitcodes.OK, Reason.STOP), (_crash_loop, exitcodes.GAVE_UP, Reason.CRASHLOOP),
    (_rejected, exitcodes.CONFIG, Reason.CONFIG), (_fatal_launch, exitcodes.CONFIG, Reason.CONFIG),
    (_fatal_after_ready, exitcodes.GAVE_UP, Reason.CRASHLOOP),
    (_called_off, exitcodes.OK, Reason.STOP),
    (_port_busy, exitcodes.START, Reason.PORT_BUSY),
    (_start_memory, exitcodes.START_MEMORY, Reason.START_MEMORY),
    (_gpu_fault, exitcodes.GPU_FAULT, Reason.GPU_FAULT),
    (_prewarm_fails, exitcodes.FAILURE, Reason.PREWARM_FAILED)])
def test_every_exit_goes_through_halt(provoke: Callable[[CoreMachine], None], code: int,
                                      reason: Reason) -> None:
    m = CoreMachine()
    provoke(m)
    _leave(m)
    exiting = [a for a in m.history if isinstance(a, Log) and a.event == "daemon.exiting"]
    assert [(a.fields["code"], a.fields["reason"]) for a in exiting] == [(code, reason)]
    assert [a.code for a in m.history if isinstance(a, Exit)] == [code]
    assert not m.alive  # the child was taken down on every way out
    m.restarts_count_the_restart_begin_lines()  # the give-up too: no restart counted for it


def test_a_launch_called_off_is_no_failure_and_the_stop_takes_over() -> None:
    m = CoreMachine()
    _called_off(m)
    _leave(m)
    said = [a.event for a in m.history if isinstance(a, Log)]
    assert "child.launch_called_off" in said and "child.spawn_failed" not in said, said
    assert "restart.begin" not in said, said
    assert not any(isinstance(a, RecordIncident) for a in m.history)  # a stop: no incident
    assert [a.code for a in m.history if isinstance(a, Exit)] == [exitcodes.OK]


@pytest.mark.parametrize("lost", [True, False])
def test_no_spin_while_a_restart_is_recorded(lost: bool) -> None:
    """A start stall fires from the health timer; while the restart's incident record is
    written nothing fires or is judged, so no timer in the past may be the next wakeup (the
    loop would spin at 100 % CPU until the record lands). Found by the walk above on CI."""
    m = CoreMachine()
    m.world_is_kind(2)  # launched; the health probe that goes out next is lost or answered
    if not lost:
        m.world_is_kind(1)
    m.time_passes(19.0)
    m.time_passes(41.0)  # past startup.stall_timeout: the restart waits on its record
    assert m.s.restart.wait is not None, m.s
    for _ in range(20):  # the loop's own turns, Ticks only, until the record's deadline
        due = machine.next_wakeup(m.s)
        assert due is not None and due > m.now, f"wakeup {due} <= now {m.now}"
        if m.s.restart.wait is None:
            break
        m.now = due
        m._step(Tick())
    assert m.s.restart.wait is None, "the record's deadline never came"


def test_a_fatal_exit_during_a_sweep_that_never_answers_still_exits() -> None:
    """A GPU fault reported while the old tree is being swept (a restart under way): the exit
    has no child to record, so it leaves at once, and the sweep's silence is bounded by
    SWEEP_WAIT like any other exit's. Found by the walk above (seed 115)."""
    m = CoreMachine()
    m.world_is_kind(2)
    m.restart()
    m.child_dies(0, False)
    probe = next(a for a in m.outstanding if isinstance(a, Probe))
    m.outstanding.remove(probe)
    m._step(_success(probe, m.gpu))
    sample = next(a for a in m.outstanding if isinstance(a, SampleMemory))
    m.outstanding.remove(sample)
    m._step(_hostile(sample, m.gpu))  # the fatal fault, while a Sweep is still out
    assert m.s.state == S.CLEANUP and m.s.exit_code == exitcodes.GPU_FAULT
    assert any(isinstance(a, Sweep) for a in m.outstanding), "the sweep must still be out"
    history = list(m.history)
    s, t = run_to_exit(m.s, m.now, history)  # the sweep never answers
    assert s.state in FINAL and t - m.now <= STOP_BOUND
    check_one_way_out(history)


@pytest.mark.parametrize("ended_by", ["crash", "startup.timeout"])
@pytest.mark.parametrize("ok", [True, False])
def test_a_smoke_answer_after_its_start_was_taken_down_is_not_judged(ended_by: str,
                                                                     ok: bool) -> None:
    # vLLM died (or startup.timeout passed) while a smoke check was out: the start keeps the
    # coarse state STARTING while its incident record is written. The check's answer that
    # lands then (a passed one, or an optional one failed) made it READY: READY=1 for a
    # dead vLLM, and the ladder's RECORDING -> IDLE raised PhaseError: exit 70.
    s = machine.initial(CONFIG, 1000.0)
    now = 1000.0
    for ev in (Tick(), SweepDone((), (), None), PrewarmDone(True), Spawned(4242),
               HealthResult(True, 200, 0.01, gen=1), CanaryResult(True, False, 0.01, gen=1),
               CanaryResult(True, False, 0.01, warmup=True, gen=1)):
        now += 1.0
        s, acts = machine.step(s, ev, now)
    smoke = [a for a in acts if isinstance(a, Smoke)]
    assert smoke and s.state == S.STARTING, (s.state, acts)
    if ended_by == "crash":
        now += 1.0
        s, _ = machine.step(s, ChildExited(4242, 1, None), now)
    else:
        now += CONFIG.startup.timeout
        s, _ = machine.step(s, Tick(), now)
    assert s.restart.phase == "recording", s.restart.phase
    s, acts = machine.step(s, SmokeResult(0, ok, 0.01, "" if ok else "HTTP 500", gen=1), now)
    assert s.state == S.STARTING and s.restart.phase == "recording"
    assert not any(isinstance(a, Notify) and a.ready for a in acts), acts
    wait = s.restart.wait
    assert wait is not None  # the take-down goes on once the record is written
    s, _ = machine.step(s, IncidentRecorded(wait.seq, "i-1", "/i/1"), now + 0.1)
    assert s.state in (S.STOPPING, S.CLEANUP), s.state


def test_a_record_written_from_ready_raises_no_stale_alarm_and_ends_by_its_deadline() -> None:
    """The falsifying walk of CI's run on bbfcd95: a restart begun from READY (vLLM's told
    line) while the metrics probe had gone unanswered; its result came due during the record.
    The record's wait judges nothing: no watchdog.probe_stale for a child being restarted,
    and the ladder goes on at the record's deadline even if the record never comes back."""
    m = CoreMachine()
    for _ in range(40):
        if m.s.state == S.READY:
            break
        m.world_is_kind(1) if m.outstanding else m.time_passes(1.0)
    assert m.s.state == S.READY
    bound = probing.bounds(m.s)[probing.K.METRICS]
    t0 = m.now
    while m.now - t0 < bound - 2:  # no probe answered: the metrics result nears its bound
        m.time_passes(1.0)
    m.child_prints(None, "[shutdown] API server: shutdown triggered", False)
    assert m.s.restart.phase == Phase.RECORDING and m.s.deadline is not None
    until, stale, said = m.s.deadline, m.s.child.probes.stale, len(m.history)
    assert until - m.now < 60  # incidents.timeout + WAIT_MARGIN: bounded
    while m.s.restart.phase == Phase.RECORDING:
        assert m.now <= until, "the record's wait outlived its deadline"
        m.time_passes(1.0)
        assert m.s.child is None or m.s.child.probes.stale == stale
    assert m.now - t0 > bound  # the metrics result came due during the wait
    assert not [a for a in m.history[said:]
                if isinstance(a, Log) and a.event == "watchdog.probe_stale"]
