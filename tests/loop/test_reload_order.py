"""One owner for the live config (issue 32 item 5): on SIGHUP the core takes the new config
first; the pieces around the loop (log level, status listener, gate, effects) follow it only
after, through the loop's one callback (the daemon's: live.Live.apply), and an invalid file
reaches none of them."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import pytest

from tests.loop.test_loop import BASE
from vllmwatch.config.schema import Config
from vllmwatch.live import Live, SwitchableLog
from vllmwatch.shell.loop import Loop
from vllmwatch.testing.driver import (
    FakeClock,
    FakeNotifier,
    SyncExecutor,
    World,
    WorldEffects,
    config_with,
    no_wait,
)


def _started(read: object, on_reloaded: Callable[[Config], None]) -> Loop:
    """A loop over the fake world whose SIGHUP rereads `read` (a Config, or the exception
    the reread raises), started."""
    def reread() -> Config:
        if isinstance(read, Exception):
            raise read
        assert isinstance(read, Config)
        return read

    loop = Loop(BASE, WorldEffects(World(), FakeNotifier()), FakeClock(), reread, environ={},
                seed=1, executor=SyncExecutor(), waiter=no_wait, install_signals=False,
                on_reloaded=on_reloaded)
    loop.start()
    return loop


def _loop(read: object) -> tuple[Loop, list[tuple[Config, Config]]]:
    seen: list[tuple[Config, Config]] = []
    holder: list[Loop] = []

    def reloaded(new: Config) -> None:
        seen.append((new, holder[0].state.config))  # what the core holds when the shell follows

    holder.append(_started(read, reloaded))
    return holder[0], seen


def _sighup(loop: Loop) -> None:
    loop.deliver_signal(signal.SIGHUP)
    for _ in range(5):
        loop.turn()


def test_the_shell_follows_the_config_the_core_already_took() -> None:
    new = config_with(BASE, probe={"timeout": 4})
    loop, seen = _loop(new)
    _sighup(loop)
    assert len(seen) == 1
    given, core_had = seen[0]
    assert given is new and core_had is new  # the core first, then the pieces around it


def test_an_invalid_file_reaches_no_piece_around_the_loop() -> None:
    loop, seen = _loop(ValueError("bad toml"))
    _sighup(loop)
    assert seen == [] and loop.state.config is BASE


class _Follower:
    """One piece around the loop: records what it was given and what the core held then."""

    def __init__(self, loop: list[Loop]) -> None:
        self.loop = loop
        self.calls: list[tuple[object, Config]] = []

    def saw(self, given: object) -> None:
        self.calls.append((given, self.loop[0].state.config))

    # the gate (Gate.reconfigure), the effects (RealEffects.reconfigure), a status listener
    def reconfigure(self, *given: object) -> None:
        self.saw(given if len(given) > 1 else given[0])

    def stop(self) -> None:
        pass


def _live_loop(read: object) -> tuple[Loop, dict[str, _Follower], Live]:
    """A loop whose on_reloaded is the daemon's: Live.apply, with every piece a recorder."""
    holder: list[Loop] = []
    parts = {name: _Follower(holder) for name in ("log", "status", "gate", "effects")}

    def make_log(c: Config) -> Any:
        parts["log"].saw(c.log.level)
        return lambda *a, **k: None

    def make_status(c: Config) -> Any:
        parts["status"].saw(c.status.listen)
        return parts["status"]

    live = Live(BASE, SwitchableLog(lambda *a, **k: None), make_log, make_status)
    live.gate, live.effects = parts["gate"], parts["effects"]
    holder.append(_started(read, live.apply))
    return holder[0], parts, live


def test_each_piece_gets_the_new_values_only_after_the_core_took_them() -> None:
    new = config_with(BASE, log={"level": "debug"}, status={"listen": "127.0.0.1:0"},
                      gate={"hold_timeout": 7.0, "retry_after": 3.0},
                      vllm={"args": {"max-num-seqs": 8}})
    loop, parts, _ = _live_loop(new)
    _sighup(loop)
    assert loop.state.config is new
    for name, part in parts.items():
        assert part.calls, f"{name} never heard of the reload"
        for _, core_had in part.calls:
            assert core_had is new, f"{name} got the new values before the core took them"
    assert parts["log"].calls[0][0] == "debug"
    assert parts["status"].calls[0][0] == "127.0.0.1:0"
    assert parts["gate"].calls[0][0][:2] == (7.0, 3.0)
    assert parts["effects"].calls[0][0] is new


def test_a_rejected_reload_reaches_no_piece() -> None:
    loop, parts, _ = _live_loop(ValueError("bad toml"))
    _sighup(loop)
    assert loop.state.config is BASE
    assert {name: part.calls for name, part in parts.items()} == {
        name: [] for name in parts}


def test_the_platform_setting_is_restart_only_and_said_so() -> None:
    """memory.unified decides the platform once, at start (shell/platform.py): a SIGHUP that
    changes it is reported, not silently half-applied."""
    loop, _, live = _live_loop(config_with(BASE, memory={"unified": "true"}))
    _sighup(loop)
    assert "memory.unified" in live.restart_required


@pytest.mark.parametrize(("key", "changed"), [
    ("memory.unified", {"memory": {"unified": "true"}}),
    ("gate.listen", {"gate": {"listen": "127.0.0.1:1"}}),
    ("log.format", {"log": {"format": "json"}}),
])
def test_a_restart_key_stays_said_across_later_reloads(key: str,
                                                       changed: dict[str, Any]) -> None:
    """Compared with the config as started: a second reload (this one changing another key)
    keeps the notice; only putting the started value back clears it."""
    live = Live(BASE, SwitchableLog(lambda *a, **k: None), lambda c: (lambda *a, **k: None),
                lambda c: None)
    first = config_with(BASE, **changed)
    assert getattr(getattr(first, key.split(".")[0]), key.split(".")[1]) != \
        getattr(getattr(BASE, key.split(".")[0]), key.split(".")[1])
    live.apply(first)
    assert key in live.restart_required
    live.apply(config_with(first, probe={"timeout": 4}))
    assert key in live.restart_required
    live.apply(config_with(BASE, probe={"timeout": 4}))
    assert key not in live.restart_required


def test_nothing_at_the_old_level_follows_the_log_level_changed_event() -> None:
    """A SIGHUP to level error: the change is said at the old level, and no line at the old
    level comes after it. Said before the new target was made, an info line that another
    thread (a forwarded child line) logged meanwhile came after log.level_changed, at level
    error (a race test_bounds_daemon's level test could lose on a loaded box)."""
    old: list[str] = []
    new: list[str] = []
    log = SwitchableLog(lambda level, event, **kw: old.append(event))

    def make_log(c: Config) -> Any:
        log("info", "child.line")  # another thread's line while the new target is made
        return lambda level, event, **kw: new.append(event)

    live = Live(BASE, log, make_log, lambda c: None)
    live.apply(config_with(BASE, log={"level": "error"}))
    assert old[-1] == "log.level_changed", old  # the last said at the old level
    log("info", "child.line")
    assert new == ["child.line"]  # the new target's (it filters by its own level)
