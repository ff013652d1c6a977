"""What a SIGHUP changes outside the core: the log level, the status listener, the gate,
the effects (standby, adapters, version cache).

The core takes the new config (probes, launches, rules) first; the pieces around the loop
follow here, on the loop's thread, once the core has taken it (shell/loop.py): the log
level (our events and the child's forwarded lines, which share one log function), a rebind
of the status listener (the new address is bound before the old one is closed, so a failed
bind keeps the old one), the gate's hold_timeout, retry_after, replay and replay_max
(written on the gate's own thread: gate/runner.Gate.reconfigure). What cannot be applied
safely while clients are connected (gate.enabled, gate.listen: moving the public port would
cut every client) is logged as `config.restart_required` and shown in /status `restart_required`.
Last, the effects' one reconfigure call (shell/effects.RealEffects.reconfigure). Nothing else
keeps a copy of the config that a reload writes: the actions carry what the shell needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from vllmwatch.config.schema import Config
from vllmwatch.core import exitcodes
from vllmwatch.gate.exchange import keepalive_of
from vllmwatch.logfn import LogFn
from vllmwatch.status.server import StatusListenError, StatusServer
from vllmwatch.status.snapshot import Snapshot
from vllmwatch.status.statusline import systemctl

# Changes that only a restart of vllmwatch applies.
RESTART_KEYS: tuple[tuple[str, Callable[[Config], object]], ...] = (
    ("gate.enabled", lambda c: c.gate.enabled),
    ("gate.listen", lambda c: c.gate.listen),
    ("log.format", lambda c: c.log.format),
    # The platform (unified memory or discrete) is decided once, at start, from this key
    # and NVML (shell/platform.py): the sampler, the start guard and prewarm follow it.
    ("memory.unified", lambda c: c.memory.unified),
)


LAST_EVENT = "daemon.exit"


class SwitchableLog:
    """One log function for the whole daemon whose target a reload swaps (any thread).

    `daemon.exit` is the daemon's last line (docs/operations/logs.md), but the core says it
    when the loop leaves, before the gate, the status server and the loop's workers are
    stopped, and they have their own last words (the gate's refusal tally, `status.stopped`,
    a spare's stop). So it is held here and written by `farewell`, once all of that is done.
    """

    def __init__(self, target: LogFn) -> None:
        self.target = target
        self._last: tuple[str, dict[str, Any]] | None = None

    def __call__(self, level: str, event: str, **fields: Any) -> None:
        if event == LAST_EVENT:
            self._last = (level, fields)
            return
        self.target(level, event, **fields)

    def farewell(self, code: int | None = None) -> None:
        """Write the held `daemon.exit`, if the core said one (once), with the code the
        daemon exits with (`code`): a crash on the way out (the loop's close, the lock's
        release) turned the decided 0 into 70, and the held line said 0 after it."""
        last, self._last = self._last, None
        if last is None:
            return
        level, fields = last
        if code is not None and fields.get("code") != code:
            level, fields = "error" if code else "info", {
                **fields, "code": code, "meaning": exitcodes.MEANING.get(code, ""),
                "decided": fields.get("code")}
        self.target(level, LAST_EVENT, **fields)


class Live:
    """The daemon's parts outside the loop, and what a reload did to them."""

    def __init__(self, config: Config, log: SwitchableLog, make_log: Callable[[Config], LogFn],
                 make_status: Callable[[Config], StatusServer | None]) -> None:
        self.config = config  # the applied config: the restart-only keys keep their start value
        self.started = config  # as started, whatever reloads came since
        self.log = log
        self._make_log, self._make_status = make_log, make_status
        self.status: StatusServer | None = None
        self.gate: Any = None  # vllmwatch.gate.runner.Gate when [gate] is on
        self.effects: Any = None  # shell/effects.RealEffects: its reconfigure follows last
        self.restart_required: tuple[str, ...] = ()
        self.spare_planned = False  # the daemon's start made a spare (shell/sparefx.make)

    def decorate(self, snap: Snapshot) -> Snapshot:
        """The snapshot with what this layer knows (restart_required)."""
        if not self.restart_required:
            return snap
        return dataclasses.replace(snap, restart_required=self.restart_required)

    def down(self) -> tuple[str, ...]:
        """The STATUS= words for what of vllmwatch's own is not as the config says: a [gate]
        that could not listen or died (gate.failed: its clients get connection errors while
        vLLM itself may be ready), and keys a reload changed that wait for a restart (the
        reload was taken: systemd heard READY=1, and "ready" alone read as all applied)."""
        words = []
        gate = self.gate
        if gate is not None and not gate.running:
            words.append(f"gate down: {gate.error or 'its thread ended'}")
        if self.restart_required:
            words.append("restart vllmwatch to apply " + ", ".join(self.restart_required))
        return tuple(words)

    def apply(self, new: Config) -> None:
        """Apply what can be applied live; report the rest (called on the loop's thread)."""
        old = self.config
        if new.log.level != old.log.level:
            # The new target is made and switched to first, and the change said through the
            # old one after (at the old level: "error" would hide it). Said first, an info line
            # that another thread (a forwarded child line) logged while the new target was
            # being made came after log.level_changed at level error.
            said, self.log.target = self.log.target, self._make_log(dataclasses.replace(
                new, log=dataclasses.replace(new.log, format=old.log.format)))
            said("warning", "log.level_changed", to=new.log.level,
                 detail="the child's forwarded lines follow the new level too")
        if new.status != old.status:
            self._rebind_status(new)
        if self.gate is not None:
            from vllmwatch.gate.runner import upstream_of  # (loaded with the gate)

            if (new.gate.replay, new.gate.replay_max) != (old.gate.replay, old.gate.replay_max):
                self.log("info", "gate.replay_changed", replay=new.gate.replay,
                         replay_max=new.gate.replay_max)
            # written on the gate's own thread, where requests read them (Gate.reconfigure)
            self.gate.reconfigure(new.gate.hold_timeout, new.gate.retry_after,
                                  new.gate.replay, new.gate.replay_max, keepalive_of(new),
                                  upstream_of(new))  # vLLM relaunches there (a new port)
        # Against the config as started, never the last reload's: a second reload must not
        # clear a notice for a key that still waits for the restart (memory.unified did).
        needed = tuple(key for key, get in RESTART_KEYS if get(new) != get(self.started))
        needed += self.started.spare.restart_keys(new.spare, old.gate.enabled,
                                                  self.spare_planned)
        if needed != self.restart_required and needed:
            self.log("warning", "config.restart_required", keys=list(needed),
                     detail="these keys take effect when vllmwatch restarts "
                            f"({systemctl('restart')}); the rest of the file is applied")
        self.restart_required = needed
        # The restart-only keys keep their started value; the rest is the new file's.
        self.config = dataclasses.replace(new, gate=dataclasses.replace(
            new.gate, enabled=old.gate.enabled, listen=old.gate.listen),
            log=dataclasses.replace(new.log, format=old.log.format))
        if self.effects is not None:  # a standby built for another command or environment goes
            self.effects.reconfigure(new)

    def _rebind_status(self, new: Config) -> None:
        old_server = self.status
        same_port = old_server is not None and _port(new.status.listen) == _port(
            self.config.status.listen)
        if same_port and old_server is not None:
            old_server.stop()  # the same port cannot be bound twice: free it first
        try:
            server = self._make_status(new)
        except StatusListenError as exc:
            if same_port:
                self._restore()
            self.log("error", "status.rebind_failed", error=str(exc),
                     detail="the status endpoint stays where it was"
                            if self.status is not None else "no status endpoint now")
            return
        if old_server is not None and not same_port:
            old_server.stop()
        self.status = server
        self.log("info", "status.rebound", listen=new.status.listen or "(disabled)")

    def _restore(self) -> StatusServer | None:
        try:
            self.status = self._make_status(self.config)
        except StatusListenError:
            self.status = None
        return self.status

    def stop(self) -> None:
        """Stop the status listener and the gate (on the way out)."""
        if self.status is not None:
            self.status.stop()
        if self.gate is not None:
            self.gate.stop()


def _port(listen: str) -> str:
    return listen.rsplit(":", 1)[-1]
