"""`vllmwatch run`: wire the real implementations around the loop and run it."""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import vllmwatch
from vllmwatch import __version__
from vllmwatch.config.command import ChildCommand, load_for_reload
from vllmwatch.config.hosts import parse_listen
from vllmwatch.config.schema import Config
from vllmwatch.config.units import spread
from vllmwatch.core import exitcodes
from vllmwatch.core.events import ReadyzPolled
from vllmwatch.core.names import Reason
from vllmwatch.live import Live, SwitchableLog
from vllmwatch.shell import fdbudget, groupfile, reaper
from vllmwatch.shell.child import instance_id, port_holder, sweep_spare_leftovers
from vllmwatch.shell.clock import SystemClock
from vllmwatch.shell.effects import RealEffects
from vllmwatch.shell.logs import LogFn, setup
from vllmwatch.shell.loop import Loop
from vllmwatch.shell.memory import make_sampler
from vllmwatch.shell.notify import (
    START_HINT,
    SystemdNotifier,
    refuse_start,
    report_crash,
    thread_crash_hook,
)
from vllmwatch.status import statusline
from vllmwatch.status.server import StatusListenError, StatusServer
from vllmwatch.status.snapshot import Snapshot

READYZ_EVERY = 5.0  # /readyz polls reported to the loop at most this often
STUCK_JOIN_S = 5.0  # how long a finished daemon waits for its worker threads


def main(config: Config, log_format: str | None = None, prewarm: bool = True,
         environ: Mapping[str, str] | None = None) -> int:
    """Run the daemon until it is told to stop or gives up; return the exit code."""
    # A vllmwatch frozen long enough for systemd's watchdog gets SIGABRT: leave a traceback
    # of every thread in the journal for the post-mortem.
    faulthandler.enable()
    env = dict(os.environ if environ is None else environ)
    if not prewarm:
        config = replace(config, prewarm=replace(config.prewarm, enabled=False))
    log = SwitchableLog(setup(log_format or config.log.format, config.log.level, environ=env))
    log("info", "daemon.version", version=__version__, pid=os.getpid(), config=config.path)
    # A worker thread's uncaught exception: one redacted event, not Python's raw traceback
    # on stderr (what follows, and why: shell/notify.py). This thread's are report_crash's.
    hook, threading.excepthook = threading.excepthook, thread_crash_hook(log)
    try:
        notifier = SystemdNotifier(log, env)
        try:
            lock = _lock_instance(config, env, log, notifier)  # before anything is bound
            if isinstance(lock, int):
                return lock
            try:
                code = _run(config, log_format, env, log, notifier)
            finally:
                if lock is not None:
                    lock.release()
        except Exception as exc:
            # A crash of the start, before the loop runs (one in the loop is the loop's):
            # what it had started is stopped by now (_run's own finally); the documented
            # exit 70, not a bare traceback and exit 1 that systemd restarts unsaid.
            code = report_crash(log, notifier, exc, "starting", START_HINT)
        leave_past_stuck_threads(code, log, lambda: log.farewell(code))
        return code
    finally:
        log.farewell()  # (said already, unless a BaseException is on its way out)
        threading.excepthook = hook


def leave_past_stuck_threads(code: int, log: LogFn, farewell: Callable[[], None] = lambda: None,
                             join_s: float = STUCK_JOIN_S) -> None:
    """Python joins every worker thread at exit (concurrent.futures' own hook): one stuck for
    good (NVML wedged on a faulted GPU, /proc/PID/smaps of a process in D state) would keep a
    daemon that has finished alive until systemd's TimeoutStopSec kills it, and turn its exit
    code (74, 75: no restart) into a kill that systemd restarts. Wait a bounded time, then
    leave without them; nothing of vLLM is left by then (the loop has stopped it). The last
    line (`farewell`: the held daemon.exit) comes after what this says, either way."""
    deadline = time.monotonic() + join_s
    for thread in _others():
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in _others() if t.is_alive()]
    if stuck:
        log("warning", "daemon.threads_stuck", threads=stuck, code=code,
            detail=f"exiting without {len(stuck)} worker thread(s) still blocked after "
            f"{join_s:g}s (a stuck NVML or /proc read)")
        farewell()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    farewell()


def _others() -> list[threading.Thread]:
    return [t for t in threading.enumerate()
            if t is not threading.current_thread() and not t.daemon]


def _run(config: Config, log_format: str | None, env: dict[str, str], log: SwitchableLog,
         notifier: SystemdNotifier) -> int:
    """The daemon, once this config's instance is ours. What its start makes (the gate, the
    status server, the effects and the spare) is stopped on the way out, whether the loop ran
    or the start raised before it: nothing is left behind for the crash report (main)."""
    with contextlib.ExitStack() as started:
        return _start(config, log_format, env, log, notifier, started)


def _start(config: Config, log_format: str | None, env: dict[str, str], log: SwitchableLog,
           notifier: SystemdNotifier, started: contextlib.ExitStack) -> int:
    fdbudget.raise_limit(log)
    # A spare engine left by a vllmwatch of this config that was killed holds GPU memory
    # (which the spare's plan would count as another's) and its socket: swept before
    # anything is planned or launched, whether or not the spare is on now.
    sweep_spare_leftovers(instance_id(config.path), log, config.restart.kill_stale)
    groupfile.remove_stale_socket(env, instance_id(config.path), log)  # (its socket file)
    config = spread_config(config, log)  # this host's slot in the quiet hours (fleets)
    holder: dict[str, Snapshot] = {"snap": Snapshot()}
    # Without systemd's watchdog (a container), a stale probe fails /livez: the kubelet acts.
    no_watchdog = not env.get("WATCHDOG_USEC")
    readyz = ReadyzWatch()
    live = Live(config, log,
                lambda c: setup(log_format or c.log.format, c.log.level, environ=env),
                lambda c: _status_server(c, log, get, no_watchdog, readyz))
    started.callback(_quietly, live.stop)  # the gate and the status server, last
    get: Callable[[], Snapshot] = lambda: live.decorate(holder["snap"])  # noqa: E731
    spare_socket = None
    considered = config.spare.considered(config.gate.enabled)
    if considered:  # the sleeping spare engine (issue 34): only then imported
        from vllmwatch.shell import child, sparefx

        spare_socket = sparefx.socket_path(env, child.instance_id(config.path))
    if config.gate.enabled:  # aiohttp is imported only when the front door is on
        from vllmwatch.gate.runner import start_gate, with_gate

        # Its body cap until the first launch says it (the version read before it may take
        # seconds): of [vllm.env] and our environment, set before its first byte is read
        live.gate = start_gate(config, log, lambda: holder["snap"],
                               fdbudget.current().gate_connections, spare_socket,
                               ChildCommand((), {**env, **config.vllm.env}).audio_body)
        get = lambda: with_gate(live.decorate(holder["snap"]), live.gate)  # noqa: E731
        if not live.gate.running:  # READY=1 means the clients' address answers: never so
            return _gate_refused(config, live.gate.error, log, notifier)
    try:
        live.status = _status_server(config, log, get, no_watchdog, readyz)
    except StatusListenError as exc:
        log("error", "status.listen_failed", error=str(exc),
            detail="running without the status endpoint; fix status.listen")

    def publish(snap: Snapshot) -> None:
        holder["snap"] = snap  # one reference swap: readers never see a half-built snapshot

    # As PID 1 of a container (or with VLLMWATCH_SUBREAPER=1): orphans come to us; reap them.
    fx = RealEffects(config, log, notifier, env, publish=publish,
                     reaper=reaper.start(env, log))
    # After the loop's close (it stops vLLM's tree): no <pid>.stacks of a gone process stays.
    started.callback(_quietly, fx.incidents.forget_stacks)
    until_loop = started.enter_context(contextlib.ExitStack())  # the loop's close, once it runs
    until_loop.callback(_quietly, fx.close)
    if live.gate is not None:
        fx.stop_order, fx.new_engine = live.gate.stop_order, live.gate.forwarder.new_engine
        fx.gate_figures = live.gate.figures
    if considered:  # the plan, from this machine's facts; on or off and why
        # Every GPU at the start for the planner (a reload may move vLLM to one that
        # vllm.gpus does not name now); the launch's own sampler for the wake's figures.
        machine = None if config.vllm.gpus is None or not config.vllm.uses_gpu else \
            make_sampler(None, lambda *_a, **_k: None,
                         unified=fx.platform.unified).sample(None, False, faults=False)
        fx.spare = sparefx.make(config, env, fx.sampler, fx.platform.unified, log,
                                current=lambda: fx.reads, machine=machine)
        if fx.spare is not None:
            until_loop.callback(_quietly, fx.spare.close)
        live.spare_planned = fx.spare is not None  # else turning it on waits for a restart
        gate = live.gate
        spare = fx.spare
        if spare is not None and gate is not None:
            spare.in_flight = lambda: gate.forwarder.spare_in_flight
            spare.stop_order = gate.stop_order
            gate.forwarder.to_spare = lambda: spare.routed == "spare"  # by Route, at once
            # ... and its generation from the same look (not the snapshot's, a turn later)
            gate.forwarder.route = lambda: spare.route(holder["snap"].child_pid)

    said: list[str] = []

    def reload() -> Config:  # on a worker thread: reads the file, logs with the old level
        changed = vllmwatch.code_changed()  # an upgrade since the start (vllmwatch.pin)
        if changed is not None and changed not in said:
            said.append(changed)
            log("warning", "daemon.code_changed", detail=changed,
                then="this daemon keeps running the code it started with (a reload re-reads "
                     "the config, not the code); restart vllmwatch when convenient to run "
                     "the new one (vLLM restarts with it)")
        # The same check as `check --config-only`, the units' first ExecReload= (exit CONFIG).
        return spread_config(load_for_reload(config.path), log)

    live.effects = fx
    # on_reloaded: on the loop's thread, once the core took the new config (shell/loop.py)
    loop = Loop(config, fx, SystemClock(), reload_config=reload, environ=env,
                on_reloaded=live.apply, spare=fx.spare, down=live.down)
    loop.state = replace(loop.state, unit=own_unit())  # for the hints' commands
    until_loop.pop_all()
    until_loop.callback(_quietly, loop.close)  # the effects and the spare are the loop's now
    fx.versions.give_up = loop.stop_asked
    if not config.gate.enabled:  # with the front door, a planned restart always deregisters
        readyz.watch(loop)
    until_loop.pop_all()  # Loop.run closes itself, crash or not
    return loop.run()


def own_unit(path: str = "/proc/self/cgroup") -> exitcodes.Unit | None:
    """The service unit this daemon runs as ("vllmwatch@gpu1", and whether a user manager
    runs it), read as /metrics' identity reads it (the innermost component; a shell in
    user@1000.service/app.slice runs as no unit); None outside one."""
    return statusline.own_unit(path)


def _quietly(stop: Callable[[], None]) -> None:
    """One step of the way out: a failure of one does not keep the next from stopping."""
    with contextlib.suppress(Exception):
        stop()


class ReadyzWatch:
    """Tells the core who polls /readyz: the deregister delay of a planned restart only
    helps a balancer that does (core/stopping.deregister_delay). A poll reaches the loop at
    most every READYZ_EVERY seconds; a rebound status listener keeps the hook."""

    def __init__(self) -> None:
        self._loop: Loop | None = None
        self._last = -READYZ_EVERY

    def watch(self, loop: Loop) -> None:
        """From now on polls are reported; none at all means nobody deregisters us."""
        self._loop = loop
        loop.post(ReadyzPolled(polled=False))

    def polled(self) -> None:
        """The status server's hook (its front thread)."""
        now = time.monotonic()
        if self._loop is not None and now - self._last >= READYZ_EVERY:
            self._last = now
            self._loop.post(ReadyzPolled())


def _lock_instance(config: Config, env: Mapping[str, str], log: LogFn, notifier: SystemdNotifier
                   ) -> groupfile.InstanceLock | int | None:
    """This config's instance lock; an exit code when another live daemon holds it (said
    as every other exit is: daemon.exiting, STOPPING=1 and the last STATUS= line); None
    (logged) when no private directory can hold one."""
    try:
        got = groupfile.acquire_lock(instance_id(config.path), env)
    except groupfile.AlreadyRunning as exc:
        return refuse_start(
            log, notifier, Reason.ALREADY_RUNNING, f"another vllmwatch, pid {exc.pid}, runs "
            f"{config.path}; nothing touched", "one vllmwatch per config: stop the other one "
            f"first ({statusline.systemctl('stop')}, or kill that pid), or give this one its "
            "own config file", holder_pid=exc.pid, lock=exc.path)
    if isinstance(got, str):
        log("warning", "daemon.unlocked", reason=got,
            detail="a second vllmwatch on this config cannot be refused")
        return None
    return got


def _gate_refused(config: Config, error: str | None, log: LogFn, notifier: SystemdNotifier
                  ) -> int:
    """The start ends, before vLLM is launched, when [gate] cannot listen: its clients would
    get connection errors while systemd (and the units ordered After= us) heard READY=1. Exit
    69, as for a busy vllm.port: systemd's Restart= tries again, the holder named."""
    host, port = parse_listen(config.gate.listen) or ("", 0)
    who = port_holder(host, port, ignore=set())
    return refuse_start(
        log, notifier, Reason.PORT_BUSY, f"gate.listen {config.gate.listen} cannot be bound"
        + (f": held by {who}" if who else f" ({error or 'the gate did not start'})"),
        "stop what holds it or set another gate.listen, then "
        f"{statusline.systemctl('restart')}", port=config.gate.listen, holder=who, error=error)


def _status_server(config: Config, log: LogFn, get: Callable[[], Snapshot],
                   no_watchdog: bool, readyz: ReadyzWatch) -> StatusServer | None:
    """The status listener for config (None when disabled); raises StatusListenError."""
    if not config.status.listen:
        return None
    server = StatusServer(config.status.listen, config.status.allow_remote, get, log,
                          stale_probes_fail_livez=no_watchdog,
                          max_pending=fdbudget.current().status_pending)
    server.on_readyz = readyz.polled
    server.start()
    return server


# Fleet-safe settings: the per-host key that spreads quiet-hours restarts across a fleet,
# applied once at the start (folded from shell/fleet.py: the import count of `run`).
MACHINE_ID_PATHS = ("/etc/machine-id", "/var/lib/dbus/machine-id")


def host_key(instance: str, paths: Sequence[str] = MACHINE_ID_PATHS) -> str:
    """machine-id (else the hostname) plus the instance: stable, and distinct per instance.

    Containers often share an empty or baked-in machine-id; the hostname (the pod name)
    differs there, so it is part of the key too.
    """
    machine = ""
    for path in paths:
        try:
            with open(path) as f:
                machine = f.read().strip()
        except OSError:
            continue
        if machine:
            break
    return f"{machine}:{socket.gethostname()}:{instance}"


def spread_config(config: Config, log: Callable[..., None], key: str | None = None) -> Config:
    """The config with restart.quiet_hours moved to this host's slot inside the window."""
    r = config.restart
    if not r.quiet_hours or r.quiet_hours_spread <= 0:
        return config
    key = host_key(f"{config.vllm.port}") if key is None else key
    window = spread(r.quiet_hours, key, r.quiet_hours_spread)
    log("info", "quiet_hours.spread", configured=r.quiet_hours, this_host=window,
        spread=r.quiet_hours_spread)
    return dataclasses.replace(config, restart=dataclasses.replace(r, quiet_hours=window))
