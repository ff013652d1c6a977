"""A healthy vLLM that drops one connection before answering (no death, no restart) gets the
request once more after SAME_ENGINE_GRACE, instead of holding its client for
gate.hold_timeout and a 503 that says vLLM is restarting when nothing restarts."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Callable
from typing import Any

import pytest

from tests.support import TIMEOUT_SCALE, free_port, wait_for
from tests.support.rawhttp import raw_upstream
from vllmwatch.config.schema import from_dict
from vllmwatch.gate import proxy
from vllmwatch.gate.runner import start_gate
from vllmwatch.status.snapshot import Snapshot

ANSWER = b'{"choices": [{"text": "ok"}]}'


def _drops(first: int) -> Callable[[socket.socket, int], None]:
    """The first `first` requests are read and their connection closed without an answer;
    the others are answered 200."""
    def answer(conn: socket.socket, n: int) -> None:
        if n > first:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                         % (len(ANSWER), ANSWER))
    return answer


def _ask(port: int) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60 * TIMEOUT_SCALE)
    try:
        conn.request("POST", "/v1/completions", b'{"prompt": "x"}',
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("replay", [True, False])
def test_a_dropped_connection_of_a_vllm_that_serves_on_is_sent_again_to_it(
        monkeypatch: pytest.MonkeyPatch, replay: bool) -> None:
    monkeypatch.setattr(proxy, "SAME_ENGINE_GRACE", 0.5, raising=False)
    with raw_upstream(_drops(1)) as (port, seen):
        config = from_dict({"vllm": {"model": "m", "host": "127.0.0.1", "port": port},
                            "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}",
                                     "replay": replay, "hold_timeout": "60s"}})
        logs: list[tuple[Any, ...]] = []
        gate = start_gate(config, lambda *a, **k: logs.append((a, k)),
                          lambda: Snapshot(state="ready", ready=True, child_pid=7))
        assert gate is not None
        try:
            status, body = _ask(gate.port)
            wait_for(lambda: gate.snapshot()["in_flight"] == 0, 30, "the exchange ended")
            stats = gate.snapshot()
        finally:
            gate.stop()
    if replay:
        assert (status, body) == (200, ANSWER) and len(seen) == 2, (status, body, seen)
        assert stats["replayed"] == 1 and stats["replay_answered"] == 1, stats
        assert stats["hold_timeouts"] == 0, stats
    else:  # not replayable: answered at once, as before, saying why it was not sent again
        assert status == 502 and b"gate.replay is off" in body and len(seen) == 1, body
