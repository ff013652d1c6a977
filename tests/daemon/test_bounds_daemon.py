"""The real daemon against the fake vLLM: the loop never blocks on a file, a key rotation is
retried, and a SIGHUP applies what it can live (log level, status.listen) and says what needs
a restart of vllmwatch."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import TIMEOUT_SCALE, Daemon, base_config, free_port, merge, to_toml, wait_for
from vllmwatch.core import exitcodes
from vllmwatch.testing.daemon import run_argv

Factory = Callable[..., Daemon]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Factory]:
    made: list[Daemon] = []

    def make(overrides: dict[str, dict[str, Any]] | None = None, start: bool = True) -> Daemon:
        cfg = merge(base_config(free_port(), free_port()), overrides or {})
        workdir = tmp_path / f"d{len(made)}"
        workdir.mkdir()
        d = Daemon(workdir, cfg)
        made.append(d)
        return d.start() if start else d

    yield make
    errors = []
    for d in made:
        try:
            d.close()
        except AssertionError as exc:
            errors.append(str(exc))
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_config_replaced_by_a_fifo_or_device_is_a_clear_failed_reload(
        daemon: Factory, kind: str) -> None:
    """The hostile pass: SIGHUP after the config became a FIFO froze the daemon for good."""
    d = daemon()
    d.wait_ready(30)
    d.config_path.unlink()
    if kind == "fifo":
        os.mkfifo(d.config_path)
    else:
        d.config_path.symlink_to("/dev/zero")
    mark = d.mark()
    d.signal(signal.SIGHUP)
    failed = d.wait_event("config.reload_failed", 20, mark)
    words = "is a FIFO" if kind == "fifo" else "is a character device"
    assert str(d.config_path) in failed["error"] and words in failed["error"], failed
    # The loop went on: probes still run, the endpoint answers, SIGTERM is honoured.
    wait_for(lambda: d.http_get("/readyz")[0] == 200, 10, "/readyz after the failed reload")
    assert d.http_get("/livez")[0] == 200
    d.signal(signal.SIGTERM)
    assert d.wait_exit(30 * TIMEOUT_SCALE) == 0


def test_an_empty_api_key_file_at_start_is_retried_not_exit_2(daemon: Factory,
                                                               tmp_path: Path) -> None:
    """A key rotation left the file empty as vllmwatch (re)started: retried with backoff."""
    key = tmp_path / "key"
    key.write_text("")
    d = daemon({"vllm": {"api_key_file": str(key)},
                "restart": {"max_restarts": 100}})
    failed = d.wait_event("child.spawn_failed", 30)
    assert str(key) in failed["error"] and "empty" in failed["error"]
    assert "retried with backoff" in failed["error"]
    assert d.proc is not None and d.proc.poll() is None  # not exit 2
    key.write_text("sk-rotated\n")
    d.wait_ready(60)


def test_a_fifo_api_key_file_is_a_config_error(daemon: Factory, tmp_path: Path) -> None:
    key = tmp_path / "key"
    os.mkfifo(key)
    d = daemon({"vllm": {"api_key_file": str(key)}})
    failed = d.wait_event("child.spawn_failed", 30)
    assert str(key) in failed["error"] and "FIFO" in failed["error"]
    assert d.wait_exit(30 * TIMEOUT_SCALE) == exitcodes.CONFIG


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_a_command_line_and_environment_past_the_kernel_s_limit_is_a_config_error(
        tmp_path: Path) -> None:
    """Each value under the 128 KiB of one string (the load refuses one past it), together
    past what exec takes (a quarter of the stack limit: 512 KiB under a 2 MiB stack): E2BIG
    at every launch was retried as a crash until max_restarts, an incident record each
    time. It is the config's: exit 78 at once."""
    big = {f"BIG_{i}": "x" * 120_000 for i in range(6)}  # 720 kB: past 512 KiB
    cfg = merge(base_config(free_port(), free_port()), {"vllm": {"env": big},
                                                         "restart": {"max_restarts": 100}})
    argv = ["prlimit", f"--stack={2 << 20}", "--",
            *run_argv(tmp_path / "vllmwatch.toml")]
    d = Daemon(tmp_path, cfg, argv=argv).start()
    try:
        failed = d.wait_event("child.spawn_failed", 30)
        assert "Argument list too long" in failed["error"] and "[vllm.env]" in failed["error"]
        assert len(failed["error"]) < 1000, "a value was echoed"
        assert d.wait_exit(30 * TIMEOUT_SCALE) == exitcodes.CONFIG
        assert d.named("restart.begin") == []
    finally:
        d.close()


def test_sighup_to_log_level_error_stops_forwarding_the_childs_info_lines(
        daemon: Factory) -> None:
    d = daemon()
    d.wait_ready(30)
    wait_for(lambda: d.named("child.line"), 20, "a forwarded child line")
    cfg = merge(d.config, {"log": {"level": "error"}})
    d.write_config(cfg)
    mark = d.mark()
    d.signal(signal.SIGHUP)
    d.wait_event("log.level_changed", 20, mark, to="error")
    after = d.mark()
    # Canaries every second make the fake vLLM print an access line each: wait for several.
    code, body = d.http_get("/status")
    assert code == 200
    wait_for(lambda: _canaries(d) >= _canaries_at(body) + 3, 30, "three more canaries")
    assert not [e for e in d.events[after:] if e.get("level") in ("info", "warning")], \
        d.events[after:][:5]


def _canaries_at(body: bytes) -> float:
    """The last canary's completion, monotonic: /status says it in wall seconds, and its
    state_since both ways (the same snapshot's pair) turns it back, so that a wall-clock
    step between two /status reads (NTP) moves neither."""
    doc = json.loads(body)
    wall = float(doc["probe_last_completed"].get("canary", 0.0))
    return wall - float(doc["state_since"]) + float(doc["state_since_monotonic"])


def _canaries(d: Daemon) -> float:
    code, body = d.http_get("/status")
    return _canaries_at(body) if code == 200 else 0.0


def test_sighup_rebinds_status_listen_and_reports_gate_keys_needing_a_restart(
        daemon: Factory) -> None:
    d = daemon()
    d.wait_ready(30)
    new_port = free_port()
    cfg = merge(d.config, {"status": {"listen": f"127.0.0.1:{new_port}"},
                           "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}"}})
    d.config_path.write_text(to_toml(cfg))
    mark = d.mark()
    d.signal(signal.SIGHUP)
    rebound = d.wait_event("status.rebound", 20, mark)
    assert rebound["listen"] == f"127.0.0.1:{new_port}"
    needed = d.wait_event("config.restart_required", 20, mark)
    assert needed["keys"] == ["gate.enabled", "gate.listen"]
    old, d.status_listen = d.status_listen, f"127.0.0.1:{new_port}"
    # /status shows the snapshot published at the end of the loop's turn, a moment after
    # the event: wait for it, do not race it
    wait_for(lambda: b'"restart_required": ["gate.enabled", "gate.listen"]' in
             d.http_get("/status")[1], 10, "restart_required in /status")
    host, port = old.rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError):  # the old address is closed
        socket.create_connection((host, int(port)), timeout=5 * TIMEOUT_SCALE).close()


def test_a_sighup_to_a_fifo_api_key_file_is_refused_and_the_running_config_kept(
        daemon: Factory, tmp_path: Path) -> None:
    d = daemon()
    d.wait_ready(30)
    key = tmp_path / "key-fifo"
    os.mkfifo(key)
    d.write_config(merge(d.config, {"vllm": {"api_key_file": str(key)}}))
    mark = d.mark()
    d.signal(signal.SIGHUP)
    failed = d.wait_event("config.reload_failed", 20, mark)
    assert str(key) in failed["error"] and "FIFO" in failed["error"]
    assert not d.named("restart.begin", mark)  # the running vLLM stays
    assert d.http_get("/readyz")[0] == 200


def test_a_sighup_to_flags_the_launch_refuses_keeps_the_running_vllm(daemon: Factory) -> None:
    """The hostile pass: a reload to a removed flag loaded (flags were judged at the launch
    only), drained and stopped a healthy vLLM, then refused its relaunch: exit 78."""
    d = daemon()
    d.wait_ready(30)
    d.write_config(merge(d.config, {"vllm": {"extra_args": ["--rope-scaling", "{}"]}}))
    mark = d.mark()
    d.signal(signal.SIGHUP)
    failed = d.wait_event("config.reload_failed", 20, mark)
    assert "--rope-scaling" in failed["error"] and "removed" in failed["error"], failed
    assert not d.named("restart.begin", mark)  # the running vLLM stays
    assert d.http_get("/readyz")[0] == 200


def test_idle_gate_clients_past_the_budget_are_shed_and_the_watchdog_goes_on(
        tmp_path: Path) -> None:
    """The hostile pass: 1,100 idle gate connections at systemd's 1,024 descriptors made every
    probe and spawn fail ("Too many open files") and the daemon gave up. With the same limit,
    the gate's share is capped and the rest is shed: probes and the status endpoint go on."""
    import resource
    import sys

    gate_port = free_port()
    cfg = merge(base_config(free_port(), free_port()), {
        "gate": {"enabled": True, "listen": f"127.0.0.1:{gate_port}"}})
    limit = 1024
    # The daemon under a hard limit of 1,024 (as systemd's default without LimitNOFILE).
    prefix = [sys.executable, "-c", "import os, resource, sys; resource.setrlimit("
              f"resource.RLIMIT_NOFILE, ({limit}, {limit})); os.execv(sys.argv[1], sys.argv[1:])"]
    d = Daemon(tmp_path, cfg, argv_prefix=prefix).start()
    socks: list[socket.socket] = []
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    try:
        d.wait_ready(30)
        budget = d.wait_event("fd.budget", 5)
        assert budget["nofile"] == limit and budget["gate_connections"] < limit // 2
        for _ in range(1100):
            socks.append(socket.create_connection(("127.0.0.1", gate_port),
                                                  timeout=10 * TIMEOUT_SCALE))
        refused = d.wait_event("gate.refused", 20)
        # past the gate's share: each newcomer closes the longest idle one (all are idle
        # here), or is shed when none is idle; either way the share is never passed
        counts = refused["counts"]
        assert counts.get("idle_timeouts", 0) + counts.get("shed_connections", 0) >= 1, counts
        # Probes still run and succeed: a canary after the flood, and the endpoint answers.
        before = _canaries(d)
        wait_for(lambda: _canaries(d) > before, 20, "a canary after the flood")
        assert d.http_get("/readyz")[0] == 200
        assert not d.named("restart.begin") and d.proc is not None and d.proc.poll() is None
        code, body = d.http_get("/metrics")
        assert code == 200 and b'vllmwatch_gate_refused_total{reason="idle_timeouts"}' in body
        gate = json.loads(d.http_get("/status")[1])["gate"]
        assert gate["connections"] <= budget["gate_connections"], gate
    finally:
        for sock in socks:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        d.close()
