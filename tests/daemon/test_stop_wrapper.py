"""A planned stop under a vllm.command that is a wrapper which does not exec vLLM.

The stop SIGTERMs the child's leader alone, for vLLM's API server to drain (8a05990). A
wrapper that dies of that SIGTERM while it waits for vLLM (dash running `vllm serve "$@"`
without exec; `bash -c 'source env; vllm serve ...'`) passed nothing on: vLLM ran on, never
told to drain, and the sweep SIGKILLed it 3 s after the wrapper's exit; every request in
flight lost its connection (leftovers.killed in the journal). The sweep now SIGTERMs the tops
of what is left (child.passed_on) and lets them drain (shell/passon.py)."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_supervisor import _running
from tests.support import (
    PYTHON,
    TIMEOUT_SCALE,
    Daemon,
    base_config,
    completion,
    free_port,
    merge,
    wait_for,
)

_FAKE = f'{PYTHON} -m vllmwatch.testing.fake_vllm --startup-seconds 0.3 "$@"'
# The trailing `; :` keeps the shell from exec'ing its last command, as a script would.
WRAPPERS = {"sh": ["sh", "-c", _FAKE + "; :", "wrapper"],
            "bash": ["bash", "-c", "true; " + _FAKE + "; :", "wrapper"]}


def _daemon(tmp_path: Path, wrapper: str, drain: str = "10s", stop: str = "30s") -> Daemon:
    # Two requests at once take 8 s (--slow-when-busy), far past the 3 s the sweep gave.
    cfg = merge(base_config(free_port(), free_port(), [
        "--slow-completion", "2", "--slow-when-busy", "8", "--shutdown-timeout", "20"]),
        {"vllm": {"command": WRAPPERS[wrapper]},
         "probe": {"canary_timeout": "5s", "canary_interval": "60s"},
         "restart": {"drain_timeout": drain, "stop_timeout": stop}})
    (tmp_path / "d").mkdir()
    return Daemon(tmp_path / "d", cfg)


def _in_flight(d: Daemon) -> tuple[list[threading.Thread], list[Any]]:
    """Two completions running in the (fake) vLLM; their (status, body) or error land in the
    list."""
    got: list[Any] = []

    def ask() -> None:
        try:
            got.append(completion(d.port, 30.0, model="tiny", max_tokens=4))
        except OSError as exc:  # the connection cut: what the old code gave
            got.append(exc)

    clients = [threading.Thread(target=ask, daemon=True) for _ in range(2)]
    for client in clients:
        client.start()
    wait_for(lambda: _running(d.port) > 1, 10.0, "two requests running in vLLM")
    return clients, got


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_a_wrapper_that_dies_at_the_stop_lets_vllm_drain(tmp_path: Path, wrapper: str) -> None:
    d = _daemon(tmp_path, wrapper)
    try:
        d.start()
        d.wait_ready()
        clients, got = _in_flight(d)
        since = d.mark()
        d.signal(signal.SIGTERM)
        for client in clients:
            client.join(40.0 * TIMEOUT_SCALE)
        assert len(got) == 2 and all(isinstance(g, tuple) and g[0] == 200 for g in got), \
            f"{got}\n{d.dump()}"
        for _, body in got:  # whole answers, not aborts
            assert json.loads(body)["usage"]["completion_tokens"] == 4, body
        assert d.wait_exit(30.0 * TIMEOUT_SCALE) == 0, d.dump()
        exited = d.wait_event("child.exited", 1.0, since)
        assert exited["signal"] == "SIGTERM" and exited["expected"], exited  # the wrapper
        passed = d.wait_event("child.passed_on", 1.0, since)
        assert "vllmwatch.testing.fake_vllm" in passed["what"][0], passed
        assert passed["signal"] == "SIGTERM" and "exec" in passed["detail"], passed
        assert not d.named("leftovers.killed", since) and not d.named("child.kill", since), \
            d.dump()
    finally:
        d.close()


def test_a_second_stop_signal_kills_what_is_left_draining(tmp_path: Path) -> None:
    d = _daemon(tmp_path, "sh")
    try:
        d.start()
        d.wait_ready()
        _in_flight(d)
        since = d.mark()
        d.signal(signal.SIGTERM)
        d.wait_event("child.passed_on", 10.0, since)
        d.signal(signal.SIGTERM)
        # promptly: long before the drain (8 s of requests, a 13 s window) would end
        assert d.wait_exit(6.0) == 0, d.dump()
        assert d.named("child.kill", since), d.dump()
        assert d.named("leftovers.killed", since), d.dump()
    finally:
        d.close()

