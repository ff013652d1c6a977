"""RealEffects.spawn driven as the loop drives it, for tests that launch without a loop."""

from __future__ import annotations

import threading
from collections.abc import Callable

from vllmwatch.config.schema import Config
from vllmwatch.core.events import Event, LaunchMayGo, LaunchWaits
from vllmwatch.shell.effects import RealEffects
from vllmwatch.testing.waiting import TIMEOUT_SCALE

# A launch's waits are bounded by 20 s each (the version read, a spare's stop); a loaded box
# stretches what comes around them, so the test's bound scales (TIMEOUT_SCALE).
WAIT = 60.0 * TIMEOUT_SCALE


def spawn(fx: RealEffects, config: Config, post: Callable[[Event], None] = lambda _e: None
          ) -> Event:
    """fx.spawn's answer; a launch that must first wait (LaunchWaits: the version read is
    slow on a loaded box) is asked again once the shell posts LaunchMayGo, as the core does."""
    may = threading.Event()

    def posted(ev: Event) -> None:
        may.set() if isinstance(ev, LaunchMayGo) else post(ev)

    for _ in range(10):
        may.clear()
        got = fx.spawn(config, posted)
        if not isinstance(got, LaunchWaits):
            return got
        assert may.wait(WAIT), f"no LaunchMayGo within {WAIT:.0f}s after: {got.detail}"
    raise AssertionError("the launch waited ten times")
