"""`vllmwatch run`: wire the real implementations around the loop and run it."""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Callable, Mapping
from dataclasses import replace

from vllmwatch import __version__
from vllmwatch.config.schema import Config, load
from vllmwatch.core import exitcodes
from vllmwatch.core.names import Reason
from vllmwatch.shell import instancelock, reaper
from vllmwatch.shell.child import instance_id
from vllmwatch.shell.clock import SystemClock
from vllmwatch.shell.effects import RealEffects
from vllmwatch.shell.fleet import spread_config
from vllmwatch.shell.logs import LogFn, setup
from vllmwatch.shell.loop import Loop
from vllmwatch.shell.notify import SystemdNotifier
from vllmwatch.status.server import StatusListenError, StatusServer
from vllmwatch.status.snapshot import Snapshot


def main(config: Config, log_format: str | None = None, prewarm: bool = True,
         environ: Mapping[str, str] | None = None) -> int:
    """Run the daemon until it is told to stop or gives up; return the exit code."""
    # A vllmwatch frozen long enough for systemd's watchdog gets SIGABRT: leave a traceback
    # of every thread in the journal for the post-mortem.
    faulthandler.enable()
    env = dict(os.environ if environ is None else environ)
    if not prewarm:
        config = replace(config, prewarm=replace(config.prewarm, enabled=False))
    log = setup(log_format or config.log.format, config.log.level, environ=env)
    log("info", "daemon.version", version=__version__, pid=os.getpid(), config=config.path)
    lock = _lock_instance(config, env, log)  # before anything is bound, swept or launched
    if isinstance(lock, int):
        return lock
    try:
        return _run(config, log_format, env, log)
    finally:
        if lock is not None:
            lock.release()


def _run(config: Config, log_format: str | None, env: dict[str, str], log: LogFn) -> int:
    config = spread_config(config, log)  # this host's slot in the quiet hours (fleets)
    notifier = SystemdNotifier(log, env)
    holder: dict[str, Snapshot] = {"snap": Snapshot()}
    gate = None
    if config.gate.enabled:  # aiohttp is imported only when the front door is on
        from vllmwatch.gate.attach import start_gate, with_gate

        gate = start_gate(config, log, lambda: holder["snap"])
        server = _status_server(config, log, lambda: with_gate(holder["snap"], gate))
    else:
        server = _status_server(config, log, lambda: holder["snap"])

    def publish(snap: Snapshot) -> None:
        holder["snap"] = snap  # one reference swap: readers never see a half-built snapshot

    # As PID 1 of a container (or with VLLMWATCH_SUBREAPER=1): orphans come to us; reap them.
    fx = RealEffects(config, log, notifier, env, publish=publish,
                     reaper=reaper.start(env, log))

    def reload() -> Config:
        new = load(config.path)
        log_new = setup(log_format or new.log.format, new.log.level, environ=env)
        fx.log = log_new
        return spread_config(new, log_new)

    loop = Loop(config, fx, SystemClock(), reload_config=reload, environ=env)
    try:
        return loop.run()
    finally:
        if server is not None:
            server.stop()
        if gate is not None:
            gate.stop()


def _lock_instance(config: Config, env: Mapping[str, str], log: LogFn
                   ) -> instancelock.InstanceLock | int | None:
    """This config's instance lock; an exit code when another live daemon holds it; None
    (logged) when no private directory can hold one."""
    try:
        got = instancelock.acquire(instance_id(config.path), env)
    except instancelock.AlreadyRunning as exc:
        code = exitcodes.ALREADY_RUNNING
        log("error", "daemon.exiting", code=code, reason=str(Reason.ALREADY_RUNNING),
            detail=f"another vllmwatch (pid {exc.pid}) runs {config.path}; nothing touched",
            holder_pid=exc.pid, lock=exc.path, meaning=exitcodes.MEANING[code],
            hint="one vllmwatch per config: stop the other one first (systemctl stop "
                 "vllmwatch, or kill that pid), or give this one its own config file")
        return code
    if isinstance(got, str):
        log("warning", "daemon.unlocked", reason=got,
            detail="a second vllmwatch on this config cannot be refused")
        return None
    return got


def _status_server(config: Config, log: LogFn, get: Callable[[], Snapshot]
                   ) -> StatusServer | None:
    if not config.status.listen:
        return None
    server = StatusServer(config.status.listen, config.status.allow_remote, get, log)
    try:
        server.start()
    except StatusListenError as exc:
        log("error", "status.listen_failed", error=str(exc),
            detail="running without the status endpoint; fix status.listen")
        return None
    return server
