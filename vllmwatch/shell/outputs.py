"""What the loop tells the world after each turn, and on the core's Notify: the snapshot the
status server reads, systemd's STATUS= line (again at least every STATUS_EVERY seconds),
WATCHDOG=1 while the core vouches for vLLM, and the READY=1 / RELOADING=1 / STOPPING=1 /
EXTEND_TIMEOUT_USEC= messages. Apart from shell/loop.py, which waits, steps the core and runs
its actions, because these are the loop's outputs with timers of their own (the next ping,
the next STATUS= line) that the loop only asks for (due())."""

from __future__ import annotations

import time
from collections.abc import Callable

from vllmwatch.core import machine, restart
from vllmwatch.core.actions import Notify
from vllmwatch.core.state import WatchState
from vllmwatch.shell.clock import Clock
from vllmwatch.shell.effects import Effects
from vllmwatch.shell.notify import status_line
from vllmwatch.status.snapshot import Snapshot
from vllmwatch.status.statusline import snapshot_of, summary

STATUS_EVERY = 10.0


class Outputs:
    """The loop's outputs: owned by the loop's thread, like everything the loop owns."""

    def __init__(self, fx: Effects, clock: Clock, watchdog: float | None,
                 snapshot: Snapshot, down: Callable[[], tuple[str, ...]] | None = None) -> None:
        self.fx, self.clock, self.snapshot = fx, clock, snapshot
        # What of vllmwatch's own is down (daemon.py: the gate): the line says so first
        self._down = down or (lambda: ())
        self._watchdog = watchdog  # seconds between WATCHDOG=1, None without systemd's
        self._next_ping = 0.0
        self._next_status = 0.0
        self._last_status = ""
        self._withheld = False  # WATCHDOG=1 held back, and said so

    def due(self) -> tuple[float | None, float]:
        """When the next WATCHDOG=1 (None: no watchdog) and the next STATUS= line are due."""
        return self._next_ping if self._watchdog is not None else None, self._next_status

    def publish(self, state: WatchState) -> None:
        """A new snapshot of `state` for readers; STATUS= when it changed or is due;
        WATCHDOG=1 when due."""
        now = self.clock.monotonic()
        self.snapshot = snapshot_of(state, now, self.clock.wall(), self.snapshot,
                                    self.fx.vllm_version())
        self.fx.publish(self.snapshot)
        text = summary(self.snapshot, self._down())
        if text != self._last_status or now >= self._next_status:
            self.fx.notifier.send(status_line(text))
            self._last_status, self._next_status = text, now + STATUS_EVERY
        if self._watchdog is not None and now >= self._next_ping:
            # A stale probe means we can no longer vouch for vLLM: let systemd's watchdog act.
            if machine.watchdog_ok(state, now):
                self.fx.notifier.send("WATCHDOG=1")
                self._withheld = False
            elif not self._withheld:  # said once: systemd's watchdog acts next
                self._withheld = True
                stuck = restart.stuck(state, now)
                self.fx.log("error", "watchdog.withheld", state=str(state.state),
                            rung=str(state.restart.phase),
                            rung_for_s=round(now - state.restart.since, 1),
                            why="a worker never answered (NVML or /proc stuck in the kernel?)"
                            if stuck else "a probe of vLLM is stale",
                            hint="systemd's watchdog restarts vllmwatch (WatchdogSec=); "
                            "`journalctl -k` for a GPU or driver fault")
            self._next_ping = now + self._watchdog

    def notify(self, action: Notify, state: WatchState) -> None:
        """The core's Notify as one sd_notify message."""
        lines = []
        if action.reloading:  # the clock a Type=notify-reload unit (systemd >= 253) wants
            usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            lines += ["RELOADING=1", f"MONOTONIC_USEC={usec}"]
        if action.ready:
            # /status and /readyz say ready before systemd (and the units ordered After=
            # us) hear READY=1: a reader that asks at once must not get a 503.
            self.publish(state)
            lines.append("READY=1")
        if action.stopping:
            lines.append("STOPPING=1")
        if action.extend_usec is not None:
            lines.append(f"EXTEND_TIMEOUT_USEC={action.extend_usec}")
        if lines:
            self.fx.notifier.send("\n".join(lines))
