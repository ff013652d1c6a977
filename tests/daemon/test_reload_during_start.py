"""A SIGHUP while vLLM still starts: systemd takes any READY=1 as the end of the start, so
the daemon sends neither RELOADING=1 nor READY=1 then; the first READY=1 comes with the first
READY. After READY the RELOADING=1 -> READY=1 pair stays (the real daemon, the fake vLLM)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import FIRST_READY_S, Daemon, base_config, free_port, merge, wait_for


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    # a start that lasts until the test ends it (creates the file): the SIGHUP lands inside
    # it on any machine, however slow
    go = tmp_path / "start.go"
    cfg = base_config(free_port(), free_port(), ["--hold-start-until", str(go)])
    d = Daemon(tmp_path, cfg)
    try:
        yield d.start()
    finally:
        d.close()


def _told(d: Daemon, *kinds: str) -> list[str]:
    assert d.notify is not None
    return [v for _, v in d.notify.lines() if v in kinds]


def test_a_reload_during_the_start_ends_nothing(daemon: Daemon) -> None:
    d = daemon
    d.wait_event("child.started", FIRST_READY_S)
    d.write_config(merge(d.config, {"probe": {"interval": "0.4s"}}))
    since = d.mark()
    d.signal(signal.SIGHUP)
    reloaded = d.wait_event("config.reloaded", 10.0, since)
    assert not d.named("child.ready"), "the fake vLLM was READY before the SIGHUP landed"
    assert _told(d, "RELOADING=1", "READY=1") == []
    (d.workdir / "start.go").touch()  # now let the start end
    ready = d.wait_ready(60.0, since)
    assert d.index(ready) > d.index(reloaded)  # in the log's order, never by wall clock
    assert _told(d, "RELOADING=1", "READY=1") == ["READY=1"]  # the first: the real READY
    # after READY a reload is acknowledged as systemd expects
    since = d.mark()
    d.signal(signal.SIGHUP)
    d.wait_event("config.reloaded", 10.0, since)
    wait_for(lambda: _told(d, "RELOADING=1", "READY=1") == ["READY=1", "RELOADING=1",
                                                              "READY=1"],
             5.0, "RELOADING=1 then READY=1 after READY")
