"""The gate reads a stream's markers per event, not per read of the socket: vLLM's `[DONE]`
or its engine-dead error event split across two TCP writes is still seen, so a finished
stream whose chunked end is lost is not counted as a cut (nor given an error event after
its end), and a dead engine's first event is still replayed instead of passed on."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

import pytest

from tests.support import TIMEOUT_SCALE, free_port, wait_for
from tests.support.rawhttp import raw_upstream
from vllmwatch.config.schema import from_dict
from vllmwatch.gate import proxy
from vllmwatch.gate.runner import Gate, start_gate
from vllmwatch.status.snapshot import Snapshot

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")
DEAD = b'data: {"error": {"message": "EngineCore encountered an issue. See stack trace"}}\n\n'
Answer = Callable[[socket.socket], None]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _pieces(conn: socket.socket, *parts: bytes) -> None:
    """Each part in its own TCP write, a pause between: the gate reads them apart."""
    for part in parts:
        conn.sendall(part)
        time.sleep(0.1)  # the writes' own pace, not a wait for a condition


@contextmanager
def _gate(answers: list[Answer]) -> Iterator[tuple[int, list[bytes], Gate]]:
    """The gate before a raw vLLM stand-in whose n-th request gets answers[n-1] (the last
    one again past the list)."""
    with raw_upstream(lambda conn, n: answers[min(n, len(answers)) - 1](conn)) as (port, seen):
        config = from_dict({"vllm": {"model": "m", "host": "127.0.0.1", "port": port},
                            "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}"}})
        gate = start_gate(config, lambda *_a, **_k: None,
                          lambda: Snapshot(state="ready", ready=True, child_pid=7))
        assert gate is not None
        try:
            yield gate.port, seen, gate
        finally:
            gate.stop()


def _stream(port: int) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60 * TIMEOUT_SCALE)
    try:
        conn.request("POST", "/v1/completions", b'{"prompt": "x", "stream": true}',
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = b""
        with suppress(http.client.IncompleteRead):  # (a lost chunked end: what came)
            body = resp.read()
        return resp.status, body
    finally:
        conn.close()


@pytest.mark.parametrize("cut", [b"data: [DO", b"data: [DONE]", b"da"])
def test_an_end_of_stream_split_across_reads_is_still_the_end(cut: bytes) -> None:
    done = b"data: [DONE]\n\n"
    rest = done[len(cut):]
    with _gate([lambda c: _pieces(c, HEAD + _chunk(b'data: {"tok": 1}\n\n'), _chunk(cut),
                                  _chunk(rest))]) as (port, _seen, gate):  # no 0-chunk: lost
        status, body = _stream(port)
        wait_for(lambda: gate.snapshot()["in_flight"] == 0, 30, "the exchange ended")
        stats = gate.snapshot()
    assert status == 200 and body.endswith(done) and b'"error"' not in body, body
    assert stats["cut_midstream"] == 0 and stats["failed_midrequest"] == 0, stats


def test_a_dead_engines_first_event_split_across_reads_is_replayed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proxy, "SAME_ENGINE_GRACE", 0.5)
    dead: Answer = lambda c: _pieces(c, HEAD + _chunk(DEAD[:20]), _chunk(DEAD[20:]),  # noqa: E731
                                     _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    fine: Answer = lambda c: c.sendall(  # noqa: E731
        HEAD + _chunk(b'data: {"tok": "ok"}\n\n') + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    with _gate([dead, fine]) as (port, seen, gate):
        status, body = _stream(port)
        wait_for(lambda: gate.snapshot()["in_flight"] == 0, 30, "the exchange ended")
        stats = gate.snapshot()
    assert status == 200 and b'"tok": "ok"' in body and b"EngineCore" not in body, body
    assert len(seen) == 2 and stats["replayed"] == 1, stats


def test_a_first_event_vllm_never_finished_is_no_begun_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM wrote half of its first event and its connection died: nothing the client could
    use had reached it, so the answer had not begun; the request is replayed (here to the same
    engine, which serves on) and the client gets one whole answer, never the half event."""
    monkeypatch.setattr(proxy, "SAME_ENGINE_GRACE", 0.5)
    half: Answer = lambda c: _pieces(  # noqa: E731
        c, HEAD + _chunk(b'data: {"id":"c1","choices":[{"delta":{"content":"hel'))
    fine: Answer = lambda c: c.sendall(  # noqa: E731
        HEAD + _chunk(b'data: {"tok": "ok"}\n\n') + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    with _gate([half, fine]) as (port, seen, gate):
        status, body = _stream(port)
        wait_for(lambda: gate.snapshot()["in_flight"] == 0, 30, "the exchange ended")
        stats = gate.snapshot()
    assert status == 200 and b'"tok": "ok"' in body and b'"hel' not in body, body
    assert len(seen) == 2 and stats["replayed"] == 1 and stats["cut_midstream"] == 0, stats
