"""A refused reload is said where `systemctl status` looks (a hostile review, 2026-12-07).

The daemon answered a refused SIGHUP with RELOADING=1 -> READY=1 (systemd: "reload done")
beside an unchanged `STATUS=ready | ...`: a reload the `ExecReload=` check passed but the
daemon refused (the file changed in between, a port only the daemon sees taken, a read past
its deadline), or a plain `kill -HUP`, read as applied everywhere but in the journal. Now
the STATUS= line and /status say it, naming the file, key and value, until a reload is
taken or vllmwatch restarts."""

from __future__ import annotations

import signal
from dataclasses import replace

from tests.loop.test_loop import BASE, up
from vllmwatch.config.schema import Config
from vllmwatch.status import view
from vllmwatch.testing.driver import Driver, config_with

PATH = "/etc/vllmwatch/vllmwatch.toml"
ERROR = (f"{PATH}:9: probe.interval: bad value '-3s'; expected seconds as a number, or a "
         "string such as \"500ms\", \"30s\", \"15m\", \"2h\", \"1h30m\" (each unit once, the "
         "largest first); accepted: 100ms to 30d")  # (the loader's own words)


def _reread(d: Driver, answer: Config | Exception) -> None:
    def read() -> Config:
        if isinstance(answer, Exception):
            raise answer
        return answer
    d.loop._reloads.read = read  # the daemon re-reads its file here


def _at(d: Driver) -> Driver:
    """d with its config read from PATH, as the daemon's is."""
    d.loop.state = replace(d.state, config=replace(d.state.config, path=PATH))
    return d


def _status(d: Driver) -> str:
    return d.notifier.sent("STATUS=")[-1]


def test_a_refused_reload_is_said_by_status_until_one_is_taken() -> None:
    d = _at(up())
    running = d.state.config
    _reread(d, ValueError(ERROR))
    before = len(d.notifier.messages)
    d.signal(signal.SIGHUP)
    told = [ln for m in d.notifier.messages[before:] for ln in m.splitlines()]
    said = [ln for ln in told if ln.startswith("STATUS=")]
    assert said, told
    # said before systemd hears the reload is over, and every line after it says it too
    assert told.index("READY=1") > told.index(said[0])
    for line in (said[0], _status(d)):
        assert "reload refused" in line and "probe.interval" in line, line
        assert "'-3s'" in line and f"{PATH}:9" in line, line
    assert d.loop.snapshot.reload_refused == ERROR
    assert d.loop.snapshot.to_json()["reload_refused"] == ERROR
    # ... and so does `vllmwatch status`, from the same document
    assert f"refused, the running config kept: {ERROR}" in view.render(
        d.loop.snapshot.to_json())
    assert d.state.config is running  # the running config is kept
    d.run_for(30)  # STATUS= is repeated: it still says so
    assert "reload refused" in _status(d)
    _reread(d, config_with(BASE, probe={"timeout": 4}))
    d.signal(signal.SIGHUP)
    assert "reload refused" not in _status(d)
    assert d.loop.snapshot.reload_refused is None
    assert "reload" not in view.render(d.loop.snapshot.to_json()).split("\nconfig")[1]


def test_a_refusal_during_the_start_is_said_too() -> None:
    d = _at(Driver(BASE))
    _reread(d, ValueError(ERROR))
    d.signal(signal.SIGHUP)
    assert "reload refused" in _status(d)
    assert not d.notifier.sent("RELOADING=1")  # (the start's READY=1 is the first one)


def test_every_refusal_names_the_file() -> None:
    d, path = _at(up()), PATH
    for error in ("reading the config took longer than 5s (a hung network mount?)", ""):
        _reread(d, ValueError(error))
        d.signal(signal.SIGHUP)
        said = d.events("config.reload_failed")[-1]["error"]
        assert said.startswith(f"{path}: ") and said == d.loop.snapshot.reload_refused, said
    assert d.events("config.reload_failed")[-1]["error"] == f"{path}: ValueError"


def test_status_view_says_a_refused_reload_and_keys_waiting_for_a_restart() -> None:
    """`vllmwatch status` showed neither: the STATUS= line said it, the summary did not."""
    doc = {"state": "ready", "ready": True, "config_path": PATH, "reload_refused": ERROR,
           "restart_required": ["gate.listen", "log.format"]}
    rows = {line.split()[0]: line for line in view.render(doc).splitlines()}
    assert rows["reload"].endswith(f"refused, the running config kept: {ERROR}"), rows
    assert rows["pending"].endswith("restart vllmwatch to apply gate.listen, log.format"), rows
    for odd in ({"reload_refused": None, "restart_required": "gate.listen"},
                {"reload_refused": "", "restart_required": 3}, {}):  # none said, no crash
        rows = {line.split()[0] for line in view.render({"state": "ready", **odd}).splitlines()}
        assert "reload" not in rows and "pending" not in rows, odd
