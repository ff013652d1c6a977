"""One owner for the live config (issue 32 item 5): on SIGHUP the core takes the new config
first; the pieces around the loop (log level, status listener, gate, standby) follow it only
after, through the loop's one callback, and an invalid file reaches none of them."""

from __future__ import annotations

import signal

from tests.loop.test_loop import BASE
from vllmwatch.config.schema import Config
from vllmwatch.shell.loop import Loop
from vllmwatch.testing import (
    FakeClock,
    FakeNotifier,
    SyncExecutor,
    World,
    WorldEffects,
    config_with,
    no_wait,
)


def _loop(read: object) -> tuple[Loop, list[tuple[Config, Config]]]:
    seen: list[tuple[Config, Config]] = []
    loop: Loop | None = None

    def reloaded(new: Config) -> None:
        assert loop is not None
        seen.append((new, loop.state.config))  # what the core holds when the shell follows

    def reread() -> Config:
        if isinstance(read, Exception):
            raise read
        assert isinstance(read, Config)
        return read

    loop = Loop(BASE, WorldEffects(World(), FakeNotifier()), FakeClock(), reread, environ={},
                seed=1, executor=SyncExecutor(), waiter=no_wait, install_signals=False,
                on_reloaded=reloaded)
    loop.start()
    return loop, seen


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
