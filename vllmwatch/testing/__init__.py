"""Fakes for tests, shipped with the package: a clock, a notifier, a scripted world.

`Driver` runs the pure core with synchronous fakes and a fake clock, so a whole supervisor
scenario (start, faults, restart ladder, backoff, crash loop) runs in milliseconds:

    d = Driver(config)
    d.run_until(lambda: d.state.state == State.READY)
    d.world.health_ok = False
    d.run_for(30)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllmwatch.config.schema import Config
from vllmwatch.core import machine
from vllmwatch.core.events import (
    Action,
    CanaryResult,
    CheckRelease,
    ChildExited,
    DoPrewarm,
    Event,
    Exit,
    HealthResult,
    Log,
    MemorySampled,
    MetricsResult,
    Notify,
    PrewarmDone,
    Probe,
    ReleaseChecked,
    SampleMemory,
    SignalGroup,
    Spawn,
    Spawned,
    Sweep,
    SweepDone,
    Tick,
)
from vllmwatch.core.samples import MemorySample
from vllmwatch.core.state import WatchState


class FakeClock:
    """A clock that moves only when told to (like trio's MockClock.jump)."""

    def __init__(self, start: float = 1000.0, wall: float = 1.7e9, minute: int = 12 * 60
                 ) -> None:
        self.now, self._wall0, self._start, self.minute = start, wall, start, minute

    def monotonic(self) -> float:
        """The fake monotonic time."""
        return self.now

    def wall(self) -> float:
        """Wall time moving with the monotonic time."""
        return self._wall0 + (self.now - self._start)

    def minute_of_day(self) -> int:
        """The local minute of day, set by the test."""
        return self.minute

    def advance(self, seconds: float) -> None:
        """Jump forward."""
        self.now += seconds


class FakeNotifier:
    """Records sd_notify messages."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def send(self, message: str) -> bool:
        """Record and succeed."""
        self.messages.append(message)
        return True

    def sent(self, prefix: str) -> list[str]:
        """Every message line that starts with prefix."""
        return [ln for m in self.messages for ln in m.splitlines() if ln.startswith(prefix)]


@dataclass
class World:
    """What the fake vLLM and machine do; tests flip these fields to inject faults."""

    health_ok: bool = True
    canary_ok: bool = True
    canary_timeout: bool = False  # the canary hangs until its timeout
    running: float = 0.0
    waiting: float = 0.0
    tokens: float = 0.0
    tokens_per_scrape: float = 0.0  # how much the counters move between scrapes
    gpu_mib: float | None = None
    host_mib: float = 1000.0
    ignore_sigterm: bool = False
    exit_code_on_term: int = 0
    port_holder: str | None = None
    leftovers: tuple[int, ...] = ()
    released: bool = True
    prewarm_ok: bool = True
    spawn_fails: str | None = None
    next_pid: int = 100
    child_alive: bool = False
    signals: list[str] = field(default_factory=list)
    spawns: int = 0


class Driver:
    """Runs step() and executes its actions against World, synchronously."""

    def __init__(self, config: Config, clock: FakeClock | None = None,
                 world: World | None = None) -> None:
        self.clock = clock or FakeClock()
        self.world = world or World()
        self.state: WatchState = machine.initial(config, self.clock.now)
        self.notifier = FakeNotifier()
        self.logs: list[Log] = []
        self.exit_code: int | None = None
        self._queue: list[Event] = []
        self.send(Tick())

    # ---- driving ----

    def send(self, event: Event) -> None:
        """Step one event and everything it causes."""
        self._queue.append(event)
        while self._queue and self.exit_code is None:
            ev = self._queue.pop(0)
            self.state, actions = machine.step(self.state, ev, self.clock.now)
            for action in actions:
                self._do(action)

    def run_until(self, pred: Callable[[], bool], max_seconds: float = 3600.0) -> bool:
        """Advance the fake clock deadline by deadline until pred() or the limit."""
        end = self.clock.now + max_seconds
        while not pred():
            if self.exit_code is not None or self.clock.now >= end:
                return pred()
            due = machine.next_wakeup(self.state)
            step = 1.0 if due is None else max(0.0, min(due, end) - self.clock.now)
            self.clock.advance(max(step, 1e-3))
            self.send(Tick())
        return True

    def run_for(self, seconds: float) -> None:
        """Advance by `seconds` of fake time."""
        end = self.clock.now + seconds
        self.run_until(lambda: self.clock.now >= end, seconds + 1)

    def kill_child(self, code: int | None = 0, signal: str | None = None) -> None:
        """The child dies by itself."""
        if self.world.child_alive:
            self.world.child_alive = False
            self.send(ChildExited(self.world.next_pid - 1, code, signal))

    def events(self, name: str) -> list[dict[str, Any]]:
        """The fields of every logged event of that name."""
        return [log.fields for log in self.logs if log.event == name]

    # ---- the fake world ----

    def _do(self, action: Action) -> None:
        w = self.world
        if isinstance(action, Log):
            self.logs.append(action)
        elif isinstance(action, Notify):
            self._notify(action)
        elif isinstance(action, Spawn):
            w.spawns += 1
            if w.spawn_fails:
                from vllmwatch.core.events import SpawnFailed

                self._queue.append(SpawnFailed(w.spawn_fails))
                return
            w.child_alive = True
            self._queue.append(Spawned(w.next_pid))
            w.next_pid += 1
        elif isinstance(action, SignalGroup):
            w.signals.append(action.signal)
            if w.child_alive and (action.signal == "SIGKILL" or not w.ignore_sigterm):
                w.child_alive = False
                sig = "SIGKILL" if action.signal == "SIGKILL" else None
                code = None if sig else w.exit_code_on_term
                self._queue.append(ChildExited(w.next_pid - 1, code, sig))
        elif isinstance(action, Probe):
            self._queue.append(self._probe(action))
        elif isinstance(action, SampleMemory):
            sample = MemorySample(source="nvml-process" if w.gpu_mib is not None else "none",
                                  tree_pids=(w.next_pid - 1,), gpu_tree_mib=w.gpu_mib,
                                  host_rss_mib=w.host_mib,
                                  host_pss_mib=w.host_mib if action.with_pss else None)
            self._queue.append(MemorySampled(sample, self.clock.minute, action.gen))
        elif isinstance(action, Sweep):
            self._queue.append(SweepDone(w.leftovers, (), w.port_holder))
            w.leftovers = ()
        elif isinstance(action, CheckRelease):
            self._queue.append(ReleaseChecked(w.released, "fake"))
        elif isinstance(action, DoPrewarm):
            self._queue.append(PrewarmDone(w.prewarm_ok, "" if w.prewarm_ok else "fake"))
        elif isinstance(action, Exit):
            self.exit_code = action.code

    def _notify(self, action: Notify) -> None:
        parts = [k.upper() + "=1" for k in ("ready", "stopping", "reloading")
                 if getattr(action, k)]
        if action.extend_usec is not None:
            parts.append(f"EXTEND_TIMEOUT_USEC={action.extend_usec}")
        self.notifier.send("\n".join(parts))

    def _probe(self, action: Probe) -> Event:
        w, gen = self.world, action.gen
        if not w.child_alive:
            return HealthResult(False, None, 0.001, "connection refused", gen=gen) \
                if action.kind == "health" else MetricsResult(False, error="refused", gen=gen) \
                if action.kind == "metrics" else CanaryResult(False, False, 0.0, "refused",
                                                              action.kind == "warmup", gen=gen)
        if action.kind == "health":
            return HealthResult(w.health_ok, 200 if w.health_ok else 503, 0.001, gen=gen)
        if action.kind == "metrics":
            w.tokens += w.tokens_per_scrape
            return MetricsResult(True, 0.002, w.running, w.waiting, 0.1, w.tokens / 2,
                                 w.tokens / 2, gen=gen)
        warm = action.kind == "warmup"
        if w.canary_timeout:
            return CanaryResult(False, True, 30.0, "timed out", warm, gen=gen)
        return CanaryResult(w.canary_ok, False, 0.01, "" if w.canary_ok else "HTTP 500", warm,
                            gen=gen)


def config_with(base: Config, **sections: dict[str, Any]) -> Config:
    """A copy of base with some section fields replaced: config_with(c, probe={...})."""
    changes = {name: dataclasses.replace(getattr(base, name), **fields)
               for name, fields in sections.items()}
    return dataclasses.replace(base, **changes)
