"""A healthy vLLM that drops one connection before answering (no death, no restart) gets the
request once more after SAME_ENGINE_GRACE, instead of holding its client for
gate.hold_timeout and a 503 that says vLLM is restarting when nothing restarts."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest

from tests.support import free_port, wait_until
from tests.support.rawhttp import read_request
from vllmwatch.config.schema import from_dict
from vllmwatch.gate import proxy
from vllmwatch.gate.runner import start_gate
from vllmwatch.status.snapshot import Snapshot

ANSWER = b'{"choices": [{"text": "ok"}]}'


@contextmanager
def _upstream(drops: int) -> Iterator[tuple[int, list[bytes]]]:
    """A raw vLLM stand-in: the first `drops` requests are read and their connection closed
    without an answer; the others are answered 200."""
    srv = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(30)
                got = read_request(conn)
                if got is None:
                    continue
                seen.append(got[0])
                if len(seen) <= drops:
                    continue  # closed with no answer
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                             % (len(ANSWER), ANSWER))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1], seen
    finally:
        with suppress(OSError):
            srv.shutdown(socket.SHUT_RDWR)  # wakes its accept(); close() alone does not
        srv.close()
        thread.join(10)
        assert not thread.is_alive()


def _ask(port: int) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
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
    with _upstream(drops=1) as (port, seen):
        config = from_dict({"vllm": {"model": "m", "host": "127.0.0.1", "port": port},
                            "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}",
                                     "replay": replay, "hold_timeout": "60s"}})
        logs: list[tuple[Any, ...]] = []
        gate = start_gate(config, lambda *a, **k: logs.append((a, k)),
                          lambda: Snapshot(state="ready", ready=True, child_pid=7))
        assert gate is not None
        try:
            status, body = _ask(gate.port)
            wait_until(lambda: gate.snapshot()["in_flight"] == 0, 30, "the exchange ended")
            stats = gate.snapshot()
        finally:
            gate.stop()
    if replay:
        assert (status, body) == (200, ANSWER) and len(seen) == 2, (status, body, seen)
        assert stats["replayed"] == 1 and stats["replay_answered"] == 1, stats
        assert stats["hold_timeouts"] == 0, stats
    else:  # not replayable: answered at once, as before, saying why it was not sent again
        assert status == 502 and b"gate.replay is off" in body and len(seen) == 1, body
