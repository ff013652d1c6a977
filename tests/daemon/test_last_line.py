"""`daemon.exit` is the daemon's last line, whatever the way out (docs/operations/logs.md).

It was not: the core says it when the loop leaves, and the gate's last `gate.refused` tally
(a warning) and `status.stopped` were written after it, when the front doors stopped. A person
reading the end of `journalctl -u vllmwatch` saw a warning after the exit line. Now the line is
held until everything the daemon started is stopped (live.SwitchableLog.farewell).
"""

from __future__ import annotations

import http.client
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import Daemon, base_config, free_port, merge
from vllmwatch.core import exitcodes
from vllmwatch.live import SwitchableLog


def _refused_twice(gate_port: int) -> None:
    """Two requests to a path the gate never forwards: the first tally is logged at once, the
    second is held for the next minute's line, or the gate's stop."""
    for _ in range(2):
        conn = http.client.HTTPConnection("127.0.0.1", gate_port, timeout=30)
        try:
            conn.request("POST", "/sleep?level=1")
            assert conn.getresponse().status == 404
        finally:
            conn.close()


def _ends_with_exit(d: Daemon, code: int) -> None:
    last = d.events[-1]
    assert last.get("event") == "daemon.exit" and last.get("code") == code, d.dump()
    assert len(d.named("daemon.exit")) == 1, d.dump()
    exit_at = d.index(last)
    for name in ("status.stopped", "gate.refused"):
        assert any(d.index(e) < exit_at for e in d.named(name)), (name, d.dump())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_ends_with_daemon_exit_after_the_gates_and_status_last_words(
        tmp_path: Path, sig: int) -> None:
    gate_port = free_port()
    d = Daemon(tmp_path, merge(base_config(free_port(), free_port()), {
        "gate": {"enabled": True, "listen": f"127.0.0.1:{gate_port}"}})).start()
    try:
        d.wait_ready(30)
        _refused_twice(gate_port)
        d.wait_event("gate.refused", 10)
        d.signal(sig)
        assert d.wait_exit(60) == exitcodes.OK
        held = d.named("gate.refused")[-1]
        assert held["counts"] == {"path_refused": 1}, d.dump()  # the stop's tally: said
        _ends_with_exit(d, exitcodes.OK)
    finally:
        d.close()


def test_a_give_up_ends_with_daemon_exit_after_the_status_servers_stop(tmp_path: Path) -> None:
    d = Daemon(tmp_path, merge(base_config(free_port(), free_port(), ["--crash-during-start",
                                                                      "0.1"]),
                               {"restart": {"max_restarts": 1, "window": "1h"}})).start()
    try:
        assert d.wait_exit(60) == exitcodes.GAVE_UP
        last = d.events[-1]
        assert last.get("event") == "daemon.exit" and last["code"] == exitcodes.GAVE_UP, d.dump()
        assert d.index(d.named("status.stopped")[0]) < d.index(last)
    finally:
        d.close()


def _recorder() -> tuple[list[tuple[str, str, dict[str, Any]]], Callable[..., None]]:
    said: list[tuple[str, str, dict[str, Any]]] = []
    return said, lambda level, event, **fields: said.append((level, event, fields))


def test_the_held_line_is_written_once_with_its_level_and_fields() -> None:
    said, target = _recorder()
    log = SwitchableLog(target)
    log("error", "daemon.exit", code=75, meaning="gave up")
    log("warning", "gate.refused", counts={"unauthorized": 1})
    assert said == [("warning", "gate.refused", {"counts": {"unauthorized": 1}})]
    log.farewell()
    log.farewell()
    assert said[1:] == [("error", "daemon.exit", {"code": 75, "meaning": "gave up"})]


def test_no_exit_said_no_farewell() -> None:
    said, target = _recorder()
    log = SwitchableLog(target)
    log.farewell()
    log("info", "daemon.exiting", code=0)
    assert said == [("info", "daemon.exiting", {"code": 0})]


def test_a_crash_on_the_way_out_rewrites_the_held_code() -> None:
    """The core decided 0, then the loop's close raised (exit 70): the last line says 70,
    and which code was decided, never the 0 after daemon.crashed's 70."""
    said, target = _recorder()
    log = SwitchableLog(target)
    log("info", "daemon.exit", code=0, meaning="stopped on request")
    log.farewell(exitcodes.INTERNAL)
    assert said == [("error", "daemon.exit", {
        "code": exitcodes.INTERNAL, "meaning": exitcodes.MEANING[exitcodes.INTERNAL],
        "decided": 0})]
    log("info", "daemon.exit", code=0, meaning="stopped on request")
    log.farewell(0)  # the same code: as held
    assert said[-1] == ("info", "daemon.exit", {"code": 0, "meaning": "stopped on request"})
