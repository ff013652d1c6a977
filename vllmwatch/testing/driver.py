"""The pure core under a fake clock, a notifier and a scripted world (source tree only).

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
from concurrent.futures import Executor
from typing import Any

from vllmwatch.config.schema import Config
from vllmwatch.core.actions import Log
from vllmwatch.core.events import ChildExited, Event
from vllmwatch.core.state import WatchState
from vllmwatch.shell.loop import Loop
from vllmwatch.testing.executors import ClockedExecutor, HeldExecutor, SyncExecutor, no_wait
from vllmwatch.testing.world import FakeClock, FakeNotifier, LogCapture, World, WorldEffects

__all__ = ["ClockedExecutor", "Driver", "FakeClock", "FakeNotifier", "HeldExecutor",
           "LogCapture", "SyncExecutor", "World", "WorldEffects", "config_with", "no_wait"]


class Driver:
    """The real Loop (the same action dispatch as the daemon) over WorldEffects, a FakeClock
    and a synchronous executor: a whole supervisor scenario runs in milliseconds."""

    def __init__(self, config: Config, clock: FakeClock | None = None,
                 world: World | None = None, executor: Executor | None = None,
                 reload_config: Callable[[], Config] | None = None) -> None:
        self.clock = clock or FakeClock()
        self.world = world or World()
        self.notifier = FakeNotifier()
        self.fx = WorldEffects(self.world, self.notifier)
        self.executor = executor or SyncExecutor()
        self.loop = Loop(config, self.fx, self.clock, reload_config, environ={}, seed=1,
                         executor=self.executor, waiter=no_wait,
                         install_signals=False)
        self.loop.start()
        self._settle()

    @property
    def state(self) -> WatchState:
        """The core's current state."""
        return self.loop.state

    @property
    def logs(self) -> list[Log]:
        """Every logged event so far."""
        return self.fx.logs

    @property
    def exit_code(self) -> int | None:
        """The exit code once the core said Exit."""
        return self.loop.exit_code

    # ---- driving ----

    def _settle(self) -> None:
        for _ in range(100_000):
            if self.exit_code is not None or not self.loop.has_work():
                return
            self.loop.turn()
        raise RuntimeError("the loop never settled")

    def send(self, event: Event) -> None:
        """Post one event and run the loop until everything it caused is done."""
        self.loop.post(event)
        self._settle()

    def signal(self, signum: int) -> None:
        """Deliver a signal as the OS would (the handler only records it)."""
        self.loop.deliver_signal(signum)
        self._settle()

    def run_until(self, pred: Callable[[], bool], max_seconds: float = 3600.0) -> bool:
        """Advance the fake clock deadline by deadline until pred() or the limit."""
        end = self.clock.now + max_seconds
        while not pred():
            if self.exit_code is not None or self.clock.now >= end:
                return pred()
            due = self.loop.next_deadline()
            step = 1.0 if due is None else max(0.0, min(due, end) - self.clock.now)
            self.clock.advance(max(step, 1e-3))
            self.loop.turn()
            self._settle()
        return True

    def run_for(self, seconds: float) -> None:
        """Advance by `seconds` of fake time."""
        end = self.clock.now + seconds
        self.run_until(lambda: self.clock.now >= end, seconds + 1)

    def tick(self, seconds: float, step: float = 0.05) -> None:
        """Advance by `seconds` in fixed steps, turning the loop at each; with a
        ClockedExecutor, results land when their fake time has passed."""
        end = self.clock.now + seconds
        while self.clock.now < end and self.exit_code is None:
            self.clock.advance(step)
            if isinstance(self.executor, ClockedExecutor):
                self.executor.release_due()
            self.loop.turn()
            self._settle()

    def kill_child(self, code: int | None = 0, signal: str | None = None) -> None:
        """The child dies by itself."""
        if self.world.child_alive:
            self.world.child_alive = False
            self.fx.exited = ChildExited(self.world.next_pid - 1, code, signal)
            self._settle()

    def events(self, name: str) -> list[dict[str, Any]]:
        """The fields of every logged event of that name."""
        return [log.fields for log in self.logs if log.event == name]


def config_with(base: Config, **sections: dict[str, Any]) -> Config:
    """A copy of base with some section fields replaced: config_with(c, probe={...})."""
    changes = {name: dataclasses.replace(getattr(base, name), **fields)
               for name, fields in sections.items()}
    return dataclasses.replace(base, **changes)
