"""`vllmwatch run`: wire the real implementations around the loop and run it."""

from __future__ import annotations

import faulthandler
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from vllmwatch import __version__
from vllmwatch.config.schema import Config, load
from vllmwatch.core.events import ReadyzPolled
from vllmwatch.shell import reaper
from vllmwatch.shell.clock import SystemClock
from vllmwatch.shell.effects import RealEffects
from vllmwatch.shell.fleet import spread_config
from vllmwatch.shell.logs import LogFn, setup
from vllmwatch.shell.loop import Loop
from vllmwatch.shell.notify import SystemdNotifier
from vllmwatch.status.server import StatusListenError, StatusServer
from vllmwatch.status.snapshot import Snapshot

READYZ_EVERY = 5.0  # /readyz polls reported to the loop at most this often


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
        if fx.standby is not None:
            fx.standby.log = log_new
        new = spread_config(new, log_new)
        fx.reconfigure(new)  # a standby built for another command or environment goes
        return new

    loop = Loop(config, fx, SystemClock(), reload_config=reload, environ=env)
    if not config.gate.enabled:  # with the front door, a planned restart always deregisters
        _watch_readyz(loop, server)
    try:
        return loop.run()
    finally:
        if server is not None:
            server.stop()
        if gate is not None:
            gate.stop()


def _watch_readyz(loop: Loop, server: StatusServer | None) -> None:
    """Tell the core who polls /readyz: the deregister delay only helps a balancer that
    does (core/stopping.deregister_delay). Posted at most every few seconds."""
    loop.post(ReadyzPolled(polled=False))
    if server is None:
        return  # no /readyz at all: nobody can deregister us
    last = [-READYZ_EVERY]

    def polled() -> None:
        now = time.monotonic()
        if now - last[0] >= READYZ_EVERY:
            last[0] = now
            loop.post(ReadyzPolled())

    server.on_readyz = polled


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
