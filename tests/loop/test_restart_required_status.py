"""A reload whose keys wait for a restart of vllmwatch says so where `systemctl status` looks
(a hostile review, 2026-12-07).

Such a reload is taken (RELOADING=1 -> READY=1: to systemd, done) and the rest of the file is
applied, but gate.listen, gate.enabled, log.format, memory.unified (and [spare] keys of a
daemon started without one) keep their started value: only the journal's
config.restart_required and /status said it, and STATUS= read as if all of it applied."""

from __future__ import annotations

import signal
from typing import Any

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


def test_keys_waiting_for_a_restart_are_said_by_status_until_put_back() -> None:
    live = Live(BASE, SwitchableLog(lambda *a, **k: None), lambda c: (lambda *a, **k: None),
                lambda c: None)
    notifier = FakeNotifier()
    read: list[Config] = []
    loop = Loop(BASE, WorldEffects(World(), notifier), FakeClock(), lambda: read[-1],
                environ={}, seed=1, executor=SyncExecutor(), waiter=no_wait,
                install_signals=False, on_reloaded=live.apply, down=live.down)
    loop.start()

    def reload(config: Config, **changed: Any) -> str:
        read.append(config_with(config, **changed))
        loop.deliver_signal(signal.SIGHUP)
        for _ in range(5):
            loop.turn()
        return notifier.sent("STATUS=")[-1]

    line = reload(BASE, gate={"listen": "127.0.0.1:1"}, log={"format": "json"})
    assert "restart vllmwatch to apply gate.listen, log.format" in line, line
    assert "restart vllmwatch" in reload(read[-1], probe={"timeout": 4})  # still waiting
    assert "restart vllmwatch" not in reload(BASE)  # the started values back: nothing waits
