"""A reload is refused when the new config would bind an address another process holds
(shell/reloadports.py; revB, 2026-12-05: a reload onto a held vllm.port stopped the healthy
vLLM and the daemon exited 69, port_busy, into systemd's restart loop). The running config's
own addresses are not looked at; what the reload moves off an address counts as ours."""

from __future__ import annotations

import io
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.shell.test_check import write_config
from tests.support import free_port
from vllmwatch.check import runner
from vllmwatch.config.errors import ConfigError
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.core import exitcodes
from vllmwatch.shell import reloadports
from vllmwatch.shell.reloadports import DAEMON, TREE


@pytest.fixture
def held() -> Iterator[int]:
    """A port this test process listens on (127.0.0.1): a foreign holder to the code."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def _config(port: int, status: int, gate: int | None = None) -> Config:
    raw: dict[str, dict[str, object]] = {
        "vllm": {"model": "/m", "gpus": [], "port": port},
        "status": {"listen": f"127.0.0.1:{status}"}, "prewarm": {"enabled": False}}
    if gate is not None:
        raw["gate"] = {"enabled": True, "listen": f"127.0.0.1:{gate}"}
    return from_dict(raw)


def nobody(pid: int) -> set[str]:
    return set()


def test_a_new_vllm_port_held_by_another_process_is_refused_naming_it(held: int) -> None:
    running = _config(free_port(), free_port())
    new = _config(held, free_port())
    with pytest.raises(ConfigError) as exc:
        reloadports.refuse_busy("/etc/v.toml", new, running, nobody)
    text = str(exc.value)
    assert "vllm.port" in text and f"127.0.0.1:{held} is in use by pid {os.getpid()}" in text
    assert "could not start again" in text, text


def test_each_listener_is_looked_at(held: int) -> None:
    running = _config(free_port(), free_port(), free_port())
    for new, key in ((_config(running.vllm.port, held, free_port()), "status.listen"),
                     (_config(running.vllm.port, free_port(), held), "gate.listen")):
        got = reloadports.problems(new, running, nobody)
        assert [p.key for p in got] == [key], got


def test_the_running_configs_own_addresses_are_not_looked_at(held: int) -> None:
    running = _config(held, free_port())  # its port held by a foreign process: not ours to say
    assert reloadports.problems(_config(held, free_port()), running, nobody) == []


def test_what_the_reload_moves_off_an_address_is_ours(held: int) -> None:
    running = _config(free_port(), free_port(), free_port())
    # vLLM binds after its old tree stopped; vllmwatch's own listeners stay
    assert reloadports.problems(_config(held, free_port()),
                                running, lambda pid: {TREE}) == []
    assert [p.key for p in reloadports.problems(
        _config(held, free_port()), running, lambda pid: {DAEMON})] == ["vllm.port"]
    # the status endpoint is rebound at once: vllmwatch's own is freed first, vLLM's is not
    new = _config(running.vllm.port, held)
    assert reloadports.problems(new, running, lambda pid: {DAEMON}) == []
    assert [p.key for p in reloadports.problems(new, running, lambda pid: {TREE})] \
        == ["status.listen"]
    # the gate binds when vllmwatch restarts: both are gone by then
    new = _config(running.vllm.port, free_port(), held)
    assert reloadports.problems(new, running, lambda pid: {TREE}) == []
    assert reloadports.problems(new, running, lambda pid: {DAEMON}) == []


def test_check_config_only_refuses_a_held_port(tmp_path: Path, held: int) -> None:
    path = write_config(tmp_path, "some/model", port=held)
    out = io.StringIO()
    assert runner.config_only(path, False, out=out) == exitcodes.CONFIG
    text = out.getvalue()
    assert "FAIL  config" in text and "vllm.port" in text, text
    assert f"is in use by pid {os.getpid()}" in text and "keep the running config" in text
    free = write_config(tmp_path, "some/model")
    assert runner.config_only(free, False, out=io.StringIO()) == exitcodes.OK


def test_the_daemons_reload_read_refuses_a_held_port_against_the_running_config(
        held: int) -> None:
    from vllmwatch.core.events import ReloadRequested
    from vllmwatch.shell.reload import ReloadRead, Reloads

    running = _config(free_port(), free_port())
    answers: list[ReloadRead] = []
    for new, refused in ((_config(held, free_port()), True),
                         (_config(free_port(), free_port()), False)):
        reloads = Reloads(lambda new=new: new, lambda: 0.0,  # type: ignore[misc]
                          lambda fn, failed: answers.append(fn()), lambda: None,
                          running=lambda: running)
        assert reloads.request() is None
        ev = reloads.answer(answers[-1])
        assert isinstance(ev, ReloadRequested)
        assert (ev.config is None) is refused, ev
        if refused:
            assert "vllm.port" in ev.error and f"pid {os.getpid()}" in ev.error, ev.error


def test_a_holder_not_visible_here_is_refused_only_where_ours_would_be_visible(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vllmwatch.check import host
    from vllmwatch.shell import ports

    port = free_port()
    monkeypatch.setattr(ports, "holders", lambda h, p, ignore=frozenset(): [
        ports.Holder(None, f"127.0.0.1:{p}")] if p == port else [])
    running, new = _config(free_port(), free_port()), _config(port, free_port())
    got = reloadports.problems(new, running, nobody)  # the daemon sees its own: foreign
    assert [p.key for p in got] == ["vllm.port"] and "ss -ltnp" in got[0].problem, got
    # check --config-only run by another user than the daemon's: maybe the service's vLLM
    assert reloadports.problems(new, None, nobody, unseen=False) == []
    monkeypatch.setattr(os, "geteuid", lambda: 12345)  # neither root nor the unit's MAINPID
    assert not host.sees_ours({})
    assert not host.sees_ours({"MAINPID": str(os.getpid())})  # the daemon is another user's
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert host.sees_ours({})


@pytest.mark.parametrize(("argv", "path"), [
    (["vllmwatch", "run", "--config", "/a.toml"], "/a.toml"),
    (["vllmwatch", "run", "--config=/a.toml"], "/a.toml"),
    (["vllmwatch", "run", "-c", "/a.toml"], "/a.toml"),
    (["vllmwatch", "-c/a.toml", "run"], "/a.toml"),
    (["vllmwatch", "run", "-c=/a.toml"], "/a.toml"),
    (["vllmwatch", "run", "--conf", "/a.toml"], "/a.toml"),
    (["vllmwatch", "--config", "/b.toml", "run", "-c", "/a.toml"], "/a.toml"),
    (["vllmwatch", "run", "--log-format", "json"], None),
    (["vllmwatch", "check", "--config-only"], None),
])
def test_the_daemons_config_is_read_in_every_spelling_the_cli_takes(
        argv: list[str], path: str | None) -> None:
    """`check --config-only` knew a running vllmwatch of this config by `--config` only: one
    started with `-c` (a custom unit) held its status port as a stranger's, and a reload of
    the unchanged config was refused. Review of the fix, 2026-12-05."""
    from vllmwatch.check.host import _config_of

    assert _config_of(argv) == path
