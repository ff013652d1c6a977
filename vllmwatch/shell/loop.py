"""The imperative shell: wait for the next event or deadline, step the core, run its actions."""

from __future__ import annotations

import contextlib
import os
import queue
import select
import signal
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from vllmwatch.config.schema import Config
from vllmwatch.core import machine
from vllmwatch.core.events import (
    Action,
    CheckRelease,
    DoPrewarm,
    Event,
    Exit,
    Log,
    MemorySampled,
    Notify,
    Probe,
    ReloadRequested,
    RestartRequested,
    SampleMemory,
    SignalGroup,
    Spawn,
    StopRequested,
    Sweep,
    Tick,
)
from vllmwatch.shell.clock import Clock
from vllmwatch.shell.effects import Effects
from vllmwatch.shell.notify import status_line, watchdog_interval
from vllmwatch.status.snapshot import Snapshot
from vllmwatch.status.statusline import snapshot_of, summary

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD)
STATUS_EVERY = 10.0


class Loop:
    """One loop owns all mutable state; worker threads only do I/O and post events back."""

    def __init__(self, config: Config, fx: Effects, clock: Clock,
                 reload_config: Callable[[], Config] | None = None,
                 environ: dict[str, str] | None = None) -> None:
        self.fx, self.clock, self._reload_config = fx, clock, reload_config
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="vllmwatch-io")
        self.state = machine.initial(config, clock.monotonic())
        self.snapshot = Snapshot(config_path=config.path, config_sha256=config.sha256)
        env = environ if environ is not None else dict(os.environ)
        self._watchdog = watchdog_interval(env, os.getpid())
        self._next_ping = 0.0
        self._next_status = 0.0
        self._last_status = ""
        self._pending_signals: list[int] = []

    # ---- plumbing ----

    def post(self, event: Event) -> None:
        """Hand an event to the loop from any thread."""
        self._events.put(event)
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"\0")

    def _submit(self, fn: Callable[[], Event]) -> None:
        def done(fut: Future[Event]) -> None:
            exc = fut.exception()
            if exc is not None:
                self.fx.log("error", "io.failed", error=f"{type(exc).__name__}: {exc}")
                return
            self.post(fut.result())

        self._pool.submit(fn).add_done_callback(done)

    def _install_signals(self) -> None:
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in _SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        # Only record; the loop does the work (gunicorn #3198: no logging in handlers).
        self._pending_signals.append(signum)

    # ---- the loop ----

    def run(self) -> int:
        """Run until the core says Exit; return its exit code."""
        self._install_signals()
        try:
            code = self._turn([Tick()])
            while code is None:
                self._wait()
                code = self._turn(self._collect())
            return code
        finally:
            self._close()

    def _wait(self) -> None:
        now = self.clock.monotonic()
        due = [t for t in (machine.next_wakeup(self.state), self._next_ping_due(),
                           self._next_status) if t is not None]
        timeout = max(0.0, min(due) - now) if due else 1.0
        fds = [self._wake_r]
        pidfd = self.fx.child_fd()
        if pidfd is not None:
            fds.append(pidfd)
        with contextlib.suppress(InterruptedError):
            select.select(fds, [], [], min(timeout, 5.0))

    def _collect(self) -> list[Event]:
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._wake_r, 512):
                pass
        events: list[Event] = []
        signals, self._pending_signals = self._pending_signals, []
        for signum in signals:
            ev = self._signal_event(signum)
            if ev is not None:
                events.append(ev)
        exited = self.fx.poll_child()
        if exited is not None:
            events.append(exited)
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                break
        return events or [Tick()]

    def _signal_event(self, signum: int) -> Event | None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            return StopRequested(signal.Signals(signum).name)
        if signum == signal.SIGUSR1:
            return RestartRequested()
        if signum == signal.SIGHUP:
            return self._reload()
        return None  # SIGCHLD only wakes us; poll_child() looks

    def _reload(self) -> Event:
        if self._reload_config is None:
            return ReloadRequested(None, "no config file to reload")
        try:
            config = self._reload_config()
        except Exception as exc:
            return ReloadRequested(None, str(exc))
        self.fx.reconfigure(config)
        return ReloadRequested(config)

    def _turn(self, events: list[Event]) -> int | None:
        code = None
        for ev in events:
            self.state, actions = machine.step(self.state, ev, self.clock.monotonic())
            for action in actions:
                result = self._execute(action)
                if result is not None:
                    code = result
        self._publish()
        return code

    # ---- actions ----

    def _execute(self, action: Action) -> int | None:
        fx = self.fx
        if isinstance(action, Log):
            fx.log(action.level, action.event, **action.fields)
        elif isinstance(action, Notify):
            self._notify(action)
        elif isinstance(action, Spawn):
            self.post(fx.spawn(action.config, self.post))
        elif isinstance(action, SignalGroup):
            fx.signal_group(action.signal)
        elif isinstance(action, Probe):
            kind, gen = action.kind, action.gen
            self._submit(lambda: fx.probe(kind, gen))
        elif isinstance(action, SampleMemory):
            pss, gen = action.with_pss, action.gen
            self._submit(lambda: MemorySampled(fx.sample_memory(pss), self.clock.minute_of_day(),
                                               gen))
        elif isinstance(action, Sweep):
            pgid, settle = action.pgid, action.settle
            self._submit(lambda: fx.sweep(pgid, settle))
        elif isinstance(action, CheckRelease):
            old = action.old_pids
            self._submit(lambda: fx.check_release(old))
        elif isinstance(action, DoPrewarm):
            config = self.state.config
            self._submit(lambda: fx.prewarm(config))
        elif isinstance(action, Exit):
            return action.code
        return None

    def _notify(self, action: Notify) -> None:
        lines = []
        if action.reloading:
            lines.append("RELOADING=1")
        if action.ready:
            lines.append("READY=1")
        if action.stopping:
            lines.append("STOPPING=1")
        if action.extend_usec is not None:
            lines.append(f"EXTEND_TIMEOUT_USEC={action.extend_usec}")
        if lines:
            self.fx.notifier.send("\n".join(lines))

    # ---- outputs: snapshot, STATUS=, WATCHDOG=1 ----

    def _next_ping_due(self) -> float | None:
        return self._next_ping if self._watchdog is not None else None

    def _publish(self) -> None:
        now = self.clock.monotonic()
        self.snapshot = snapshot_of(self.state, now, self.clock.wall(), self.snapshot,
                                    self.fx.vllm_version())
        self.fx.publish(self.snapshot)
        text = summary(self.snapshot)
        if text != self._last_status or now >= self._next_status:
            self.fx.notifier.send(status_line(text))
            self._last_status, self._next_status = text, now + STATUS_EVERY
        if self._watchdog is not None and now >= self._next_ping:
            self.fx.notifier.send("WATCHDOG=1")
            self._next_ping = now + self._watchdog

    def _close(self) -> None:
        signal.set_wakeup_fd(-1)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.fx.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
