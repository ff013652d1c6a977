"""Properties of the pure core, checked with hypothesis's stateful testing.

Random sequences of events, signals, worker results (answered, failed or never) and time
jumps are fed to `step`; after every step these must hold:
- step never raises (a TransitionError would be a bug in the table or the ladder);
- at most one child: a Spawn is never emitted while an earlier child may still be alive
  (every spawned child was reaped, killed or swept first);
- from ANY reachable state, a stop request reaches Exit within
  stop_timeout + KILL_WAIT + SWEEP_WAIT of fake time, even if no worker ever answers again;
- while READY, every probe kind the core started either comes back or shows up as stale.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from vllmwatch.config.schema import Config, from_dict
from vllmwatch.core import ladder, machine, probing
from vllmwatch.core.events import (
    Action,
    AsyncAction,
    CanaryResult,
    CheckRelease,
    ChildExited,
    ChildOutput,
    DoPrewarm,
    Event,
    Exit,
    HealthResult,
    IncidentRecorded,
    MemorySampled,
    MetricsResult,
    PrewarmDone,
    Probe,
    RecordIncident,
    ReleaseChecked,
    ReloadRequested,
    RestartRequested,
    SampleMemory,
    SignalGroup,
    Spawn,
    Spawned,
    SpawnFailed,
    StopRequested,
    Sweep,
    SweepDone,
    Tick,
    failure_result,
)
from vllmwatch.core.samples import MemorySample
from vllmwatch.core.state import FINAL, S, WatchState

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
})
OTHER = dataclasses.replace(CONFIG, vllm=dataclasses.replace(CONFIG.vllm, port=8001))
STOP_BOUND = CONFIG.restart.stop_timeout + ladder.KILL_WAIT + ladder.SWEEP_WAIT + 0.01


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
    assert isinstance(action, DoPrewarm)
    return PrewarmDone(True)


def run_to_exit(s: WatchState, now: float) -> tuple[WatchState, float]:
    """Drive the core with Ticks only (no worker ever answers) until it exits or time runs
    out well past the bound."""
    limit = now + 10 * STOP_BOUND
    while s.state not in FINAL and now < limit:
        due = machine.next_wakeup(s)
        now = max(now + 0.001, due if due is not None else now + 1.0)
        s, acts = machine.step(s, Tick(), now)
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
        self._step(Tick())

    # ---- plumbing ----

    def _step(self, ev: Event) -> None:
        # The shell answers a Spawn synchronously, before any other event (the contract of
        # events.Spawn; Loop._turn does so): its answer is stepped right after.
        queue = [ev]
        while queue and not self.exited:
            self.s, acts = machine.step(self.s, queue.pop(0), self.now)
            self.answers: list[Event] = []
            for a in acts:
                self._effect(a)
            queue = self.answers + queue

    def _launch(self) -> Event:
        if not self.spawn_ok:
            return SpawnFailed("no such file")
        pid = self.next_pid
        self.next_pid += 1
        self.alive.add(pid)
        return Spawned(pid)

    def _effect(self, a: Action) -> None:
        if isinstance(a, Spawn):
            assert not self.alive, f"Spawn while children {self.alive} may be alive"
            self.answers.append(self._launch())
        elif isinstance(a, (Probe, SampleMemory, Sweep, CheckRelease, DoPrewarm,
                            RecordIncident)):
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

    @rule(ok=st.booleans())
    def next_launch_works(self, ok: bool) -> None:
        self.spawn_ok = ok

    @precondition(lambda self: bool(self.alive))
    @rule(code=st.sampled_from([0, 1, 2, None]))
    def child_dies(self, code: int | None) -> None:
        pid = max(self.alive)
        self.alive.discard(pid)
        self._step(ChildExited(pid, code, None if code is not None else "SIGKILL"))

    @rule(milestone=st.sampled_from([None, "weights", "graphs"]))
    def child_prints(self, milestone: str | None) -> None:
        self._step(ChildOutput(milestone))

    @precondition(lambda self: bool(self.outstanding))
    @rule(data=st.data(), how=st.sampled_from(["ok", "fail", "lost"]))
    def worker_answers(self, data: st.DataObject, how: str) -> None:
        i = data.draw(st.integers(0, len(self.outstanding) - 1))
        action = self.outstanding.pop(i)
        if isinstance(action, Sweep):
            self.alive.clear()  # the sweep kills what is left of our tree
        if how == "ok":
            self._step(_success(action, self.gpu))
        elif how == "fail":
            self._step(failure_result(action, "boom"))
        # "lost": a worker that never answers (the freshness guard must see it)

    @rule(mib=st.floats(min_value=0.0, max_value=3000.0))
    def gpu_memory_moves(self, mib: float) -> None:
        self.gpu = mib

    # ---- invariants ----

    @invariant()
    def stop_always_exits_in_time(self) -> None:
        if self.exited:
            return
        t0 = self.now
        s, _ = machine.step(self.s, StopRequested("SIGTERM"), t0)
        s, t = run_to_exit(s, t0)
        assert s.state in FINAL, f"stop from {self.s.state} did not exit"
        assert t - t0 <= STOP_BOUND, f"stop from {self.s.state} took {t - t0:.1f}s"

    @invariant()
    def ready_probes_are_fresh_or_flagged(self) -> None:
        c = self.s.child
        if self.s.state != S.READY or c is None:
            return
        for kind, bound in probing.bounds(self.s).items():
            last = c.probe_done_at.get(kind, self.s.since)
            if self.now - last > bound + 0.01 and machine.next_wakeup(self.s) is not None:
                # overdue: the next step must flag it (a Tick at now is due)
                s2, _ = machine.step(self.s, Tick(), self.now)
                assert s2.state != S.READY or kind in (s2.child.stale if s2.child else ())

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
    max_examples=150, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestCore = CoreMachine.TestCase
