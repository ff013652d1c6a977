"""The imperative shell: wait for the next event or deadline, step the core, run its actions."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import select
import signal
import threading
import traceback
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import vllmwatch
from vllmwatch.config import vllminfo
from vllmwatch.config.schema import Config
from vllmwatch.core import machine
from vllmwatch.core.actions import (
    Action,
    AsyncAction,
    CheckRelease,
    DoPrewarm,
    Exit,
    KillEngines,
    Log,
    Notify,
    Probe,
    RecordIncident,
    SampleMemory,
    SignalGroup,
    Smoke,
    SpareAction,
    Spawn,
    StartOver,
    StopSending,
    Sweep,
    UpdateAdapters,
    failure_result,
)
from vllmwatch.core.events import Event, ReloadRequested, RestartRequested, StopRequested, Tick
from vllmwatch.logfn import Repeats
from vllmwatch.shell.clock import Clock
from vllmwatch.shell.effects import Effects
from vllmwatch.shell.notify import LOOP_HINT, report_crash, watchdog_interval
from vllmwatch.shell.outputs import Outputs
from vllmwatch.shell.reload import STUCK_MAX, ReloadRead, Reloads
from vllmwatch.status.snapshot import Snapshot

if TYPE_CHECKING:  # imported by a run only when the spare's plan is considered
    from vllmwatch.shell.sparerun import SpareFx

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD)
MAX_SLEEP = 5.0  # wake at least this often, whatever the core says


# wait(fds, timeout): block until one of fds is readable or the timeout passes.
Waiter = Callable[[list[int], float], None]


def select_waiter(fds: list[int], timeout: float) -> None:
    """The real waiter: select() on the self-pipe and the child's pidfd."""
    with contextlib.suppress(InterruptedError):
        select.select(fds, [], [], timeout)


def _close_fds(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class Loop:
    """One loop owns all mutable state; worker threads only do I/O and post events back.

    Every effect it submits posts exactly one result: the worker's own, or, when the worker
    raised, the action's failure result (actions.failure_result) — so no probe stays in flight
    for good. An unexpected error in the loop itself is logged once with its traceback, the
    vLLM tree is killed, and run() returns exitcodes.INTERNAL.
    """

    def __init__(self, config: Config, fx: Effects, clock: Clock,
                 reload_config: Callable[[], Config] | None = None,
                 environ: dict[str, str] | None = None, *, seed: int | None = None,
                 executor: Executor | None = None, waiter: Waiter | None = None,
                 install_signals: bool = True,
                 on_reloaded: Callable[[Config], None] | None = None,
                 spare: SpareFx | None = None,
                 down: Callable[[], tuple[str, ...]] | None = None) -> None:
        self.fx, self.clock = fx, clock
        self._events: queue.SimpleQueue[Event | ReloadRead] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        weakref.finalize(self, _close_fds, self._wake_r, self._wake_w)
        self._pool = executor or ThreadPoolExecutor(max_workers=8 + STUCK_MAX,  # (+ hung
                                                    thread_name_prefix="vllmwatch-io")  # reloads)
        self._wait_fn = waiter or select_waiter
        self._install = install_signals
        rng = seed if seed is not None else int.from_bytes(os.urandom(8), "little")
        self.state = machine.initial(config, clock.monotonic(), rng)
        self._spare = spare  # the sleeping spare engine (issue 34): its track starts here
        if spare is not None:
            self.state = dataclasses.replace(self.state, spare=spare.track(clock.monotonic()))
        env = environ if environ is not None else dict(os.environ)
        self._out = Outputs(fx, clock, watchdog_interval(env, os.getpid()),
                            Snapshot(config_path=config.path, config_sha256=config.sha256),
                            down)  # (STATUS=: the gate down, live.py)
        self._pending_signals: list[int] = []
        # Set at close(): a pre-warm under way ends now (its worker thread would hold the
        # daemon's exit, which waits for worker threads, until its step ended on its own);
        # a version probe of a reload's read likewise (vllminfo.stop_probes).
        self._leaving = threading.Event()
        self.exit_code: int | None = None
        self._repeats = Repeats(lambda *a, **kw: self.fx.log(*a, **kw), clock.monotonic)
        self._reloads = Reloads(reload_config, clock.monotonic, self._pool_submit,
                                lambda: self.deliver_signal(signal.SIGHUP),
                                spare.inputs if spare is not None else None,
                                running=lambda: self.state.config)
        self._on_reloaded = on_reloaded

    # ---- plumbing ----

    def post(self, event: Event | ReloadRead) -> None:
        """Hand an event to the loop from any thread."""
        self._events.put(event)
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"\0")

    def _pool_submit(self, fn: Callable[[], ReloadRead],
                     failed: Callable[[str], ReloadRead]) -> None:
        """Run fn on a worker and post its answer (or failed(error)'s): always one answer."""
        def done(fut: Future[ReloadRead]) -> None:
            if not fut.cancelled():
                exc = fut.exception()
                self.post(fut.result() if exc is None else failed(f"{type(exc).__name__}: "
                                                                  f"{exc}"))
        try:
            self._pool.submit(fn).add_done_callback(done)
        except RuntimeError as exc:  # the pool is shut down
            self.post(failed(str(exc)))

    def _submit(self, action: AsyncAction, fn: Callable[[], Event]) -> None:
        def done(fut: Future[Event]) -> None:
            if fut.cancelled():
                return  # only on the way out, when nobody waits for results any more
            exc = fut.exception()
            if exc is None:
                self.post(fut.result())
                return
            # The same failure again and again (a malformed answer on every probe): one
            # event per minute with a count, the traceback only the first time.
            self._repeats((type(action).__name__, type(exc).__name__), "error", "io.failed",
                          drop_on_repeat=("traceback",), action=type(action).__name__,
                          error=f"{type(exc).__name__}: {exc}",
                          traceback="".join(traceback.format_exception(exc)))
            self.post(failure_result(action, f"{type(exc).__name__}: {exc}"))

        try:
            self._pool.submit(fn).add_done_callback(done)
        except RuntimeError as exc:  # the pool is shut down: still one result
            self.post(failure_result(action, str(exc)))

    def deliver_signal(self, signum: int, _frame: Any = None) -> None:
        """The signal handler: only record and wake (gunicorn #3198: no logging here)."""
        self._pending_signals.append(signum)
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"\0")

    def _install_signals(self) -> None:
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in _SIGNALS:
            signal.signal(sig, self.deliver_signal)
        for early in vllmwatch.early_signals():  # came while `run` was starting (cli.py)
            self.deliver_signal(early, None)

    # ---- the loop ----

    def run(self) -> int:
        """Run until the core says Exit; return its exit code."""
        if self._install:
            self._install_signals()
        try:
            code = self.start()
            while code is None:
                code = self.turn()
            return code
        except Exception as exc:
            # The exit the core cannot decide (it may be what raised) gets the same exit
            # event and STOPPING=1 that ladder.halt gives every other exit; one it decided
            # already was said, and its code stands (shell/notify.py).
            return report_crash(self.fx.log, self.fx.notifier, exc, str(self.state.state),
                                LOOP_HINT, decided=self.state.exit_code)
        finally:
            self.close()
            if self._install:  # decided: a signal during the exit that follows must not
                # turn code 0 into a death by that signal (Python restores the defaults at
                # its shutdown, after main returns)
                for sig in _SIGNALS[:-1]:  # (not SIGCHLD)
                    signal.signal(sig, signal.SIG_IGN)

    def has_work(self) -> bool:
        """Whether events or signals are waiting (for drivers that step the loop by hand)."""
        return bool(self._pending_signals) or not self._events.empty() \
            or self.fx.child_exit_pending()

    def stop_asked(self) -> bool:
        """Whether a SIGTERM or SIGINT waits for the next turn (a launch gives up for it)."""
        return any(sig in (signal.SIGTERM, signal.SIGINT) for sig in self._pending_signals)

    def start(self) -> int | None:
        """The first turn: the core's opening Tick."""
        return self._turn([Tick()])

    def turn(self) -> int | None:
        """Wait for something to happen (or the next deadline), then act on it."""
        self._wait()
        return self._turn(self._collect())

    def next_deadline(self) -> float | None:
        """The earliest moment the loop must wake by itself."""
        due = [t for t in (machine.next_wakeup(self.state), *self._out.due(),
                           self._reloads.due) if t is not None]
        return min(due) if due else None

    def _wait(self) -> None:
        due = self.next_deadline()
        timeout = 1.0 if due is None else max(0.0, due - self.clock.monotonic())
        # (a dead spare is seen at once, with or without SIGCHLD)
        spare_fd = self._spare.fd() if self._spare is not None else None
        fds = [fd for fd in (self._wake_r, self.fx.child_fd(), spare_fd) if fd is not None]
        self._wait_fn(fds, min(timeout, MAX_SLEEP))

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
        gone = self._spare.poll() if self._spare is not None else None
        if gone is not None:
            events.append(gone)
        while True:
            try:
                got = self._reloads.answer(self._events.get_nowait())
            except queue.Empty:
                break
            if got is not None:
                events.append(got)
        overdue = self._reloads.overdue()
        if overdue is not None:
            events.append(overdue)
        return events or [Tick()]

    def _signal_event(self, signum: int) -> Event | None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            return StopRequested(signal.Signals(signum).name)
        if signum == signal.SIGUSR1:
            return RestartRequested()
        if signum == signal.SIGHUP:
            return self._reloads.request()
        return None  # SIGCHLD only wakes us; poll_child() looks

    def _turn(self, events: list[Event]) -> int | None:
        pending = list(events)
        while pending and self.exit_code is None:
            ev = pending.pop(0)
            self.state, actions = machine.step(self.state, ev, self.clock.monotonic())
            for action in actions:
                # A launch's answer is handled before anything else that was waiting, so
                # no event can see a launch that is out but unanswered by mistake.
                now_ev = self._execute(action)
                if now_ev is not None:
                    pending.insert(0, now_ev)
            if isinstance(ev, ReloadRequested) and ev.config is not None \
                    and self.state.config is ev.config and self._on_reloaded is not None:
                self._on_reloaded(ev.config)  # the core took it: the rest follows, never ahead
        if self.exit_code is None:  # the standby's step: watch it, build one once READY
            self.fx.tend_standby(self.state.state, self.state.pid, self.state.config)
        self._repeats.flush(force=self.exit_code is not None)  # counts of a failure now gone
        self._out.publish(self.state)
        return self.exit_code

    @property
    def snapshot(self) -> Snapshot:
        """The latest snapshot the loop published."""
        return self._out.snapshot

    # ---- actions ----

    def _execute(self, action: Action) -> Event | None:
        fx = self.fx
        if isinstance(action, Log):
            fx.log(action.level, action.event, **action.fields)
        elif isinstance(action, Notify):
            self._out.notify(action, self.state)
        elif isinstance(action, Spawn):
            return fx.spawn(action.config, self.post)
        elif isinstance(action, SignalGroup):
            fx.signal_group(action.signal, action.leader)
        elif isinstance(action, KillEngines):
            fx.kill_engines()
        elif isinstance(action, StopSending):
            fx.stop_sending()
        elif isinstance(action, StartOver):
            fx.end_start(action.why)
        elif isinstance(action, Probe):
            self._submit(action, lambda: fx.probe(action))
        elif isinstance(action, SampleMemory):
            minute = self.clock.minute_of_day()
            self._submit(action, lambda: fx.sample_memory(action, minute))
        elif isinstance(action, Sweep):
            self._submit(action, lambda: fx.sweep(action))
        elif isinstance(action, CheckRelease):
            self._submit(action, lambda: fx.check_release(action))
        elif isinstance(action, DoPrewarm):
            self._submit(action, lambda: fx.prewarm(action.config, self._leaving))
        elif isinstance(action, RecordIncident):
            self._submit(action, lambda: fx.record_incident(action))
        elif isinstance(action, Smoke):
            self._submit(action, lambda: fx.smoke(action))
        elif isinstance(action, SpareAction) and self._spare is not None:
            self._spare.do(action, self.post, self.state.config)
        elif isinstance(action, Exit):
            self.exit_code = action.code
        elif isinstance(action, UpdateAdapters):
            fx.update_adapters(action)  # sent off the loop; vLLM's answers are logged
        return None

    def close(self) -> None:
        """Restore signals, stop the workers, and never leave a child behind."""
        self._leaving.set()
        vllminfo.stop_probes()  # a reload's version probe under way: its thread ends now
        if self._install:
            signal.set_wakeup_fd(-1)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._spare is not None:
            self._spare.close()
        self.fx.close()
