"""A third hostile review of the gate (2026-12-05): aiohttp's own page for a request it
cannot parse quoted the offending bytes back, a client's key among them, past the redactor;
connections that never send a byte held every slot for IDLE_TIMEOUT (60 s) and locked every
client out; a transfer coding other than chunked reached vLLM as plain bytes."""

from __future__ import annotations

import contextlib
import socket
from contextlib import ExitStack

import pytest

from tests.shell.test_gate_unread import _gate, _get, _reader, _Vllm
from tests.support import TIMEOUT_SCALE, wait_for
from vllmwatch.gate import guard

READ = 20.0 * TIMEOUT_SCALE  # a socket's bound on an expected answer or close
SECRET = b"tok_live_4f9a8b7c6d5e4f3a2b1c"


def _answer(s: socket.socket) -> bytes:
    out = b""
    with contextlib.suppress(ConnectionResetError, TimeoutError):
        while chunk := s.recv(65536):
            out += chunk
    return out


@pytest.mark.parametrize("request_bytes", [
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + SECRET
    + b"\x01\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Api-Key: " + SECRET
    + b"\x7f\r\nContent-Length: 2\r\n\r\n{}",
    b"GET /v1/models?api_key=" + SECRET + b"\xff HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + SECRET
    + b"x" * 9000 + b"\r\n\r\n",  # over the field cap: aiohttp quotes its start
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Key: " + SECRET + b"\r\n"
    b"Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n{}",  # smuggling: both
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer\r\n " + SECRET
    + b"\r\nContent-Length: 2\r\n\r\n{}",  # obs-fold
])
def test_a_request_aiohttp_cannot_parse_is_answered_without_its_bytes(
        request_bytes: bytes) -> None:
    with _gate() as g, socket.create_connection(("127.0.0.1", g.port), timeout=READ) as s:
        s.sendall(request_bytes)
        out = _answer(s)
    assert out.startswith((b"HTTP/1.1 400", b"HTTP/1.0 400")), out[:300]
    assert SECRET not in out and b"tok_live" not in out, out
    assert b"could not parse" in out and _Vllm.seen == []
    head, _, body = out.partition(b"\r\n\r\n")  # the API's JSON error, never a retry
    assert b"application/json" in head and b"X-Should-Retry: false" in head, head
    assert b'"code": 400' in body, body


def test_connections_that_never_send_a_byte_are_closed_at_the_header_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("HEADER_TIMEOUT", 1.0), ("SWEEP_EVERY", 0.1)):
        monkeypatch.setattr(guard, name, value)  # IDLE_TIMEOUT stays 60 s
    with _gate(max_connections=8) as g, ExitStack() as stack:
        silent = [stack.enter_context(socket.create_connection(("127.0.0.1", g.port), READ))
                  for _ in range(3)]
        wait_for(lambda: g.snapshot()["idle_timeouts"] >= 3, 30, "the silent ones closed")
        for s in silent:
            assert _answer(s) == b""  # closed by the gate, nothing sent
        assert _get(g.port).startswith(b"HTTP/1.1 200")


def test_at_the_cap_the_longest_idle_connection_makes_room() -> None:
    with _gate(max_connections=4) as g, ExitStack() as stack:
        first = stack.enter_context(socket.create_connection(("127.0.0.1", g.port), READ))
        for _ in range(3):
            stack.enter_context(socket.create_connection(("127.0.0.1", g.port), READ))
        wait_for(lambda: g.snapshot()["connections"] == 4, 30, "4 idle connections")
        assert _get(g.port).startswith(b"HTTP/1.1 200"), "a new client is served"
        assert _answer(first) == b"", "the oldest idle one was closed"
        assert g.snapshot()["shed_connections"] == 0


def test_at_the_cap_with_none_idle_a_new_connection_is_shed() -> None:
    with _gate(max_connections=4) as g, ExitStack() as stack:
        for _ in range(4):  # each with its stream in flight: busy
            stack.callback(_reader(g.port).close)
        wait_for(lambda: g.snapshot()["in_flight"] == 4, 30, "4 streams in flight")
        assert b"too many clients" in _get(g.port)
        assert g.snapshot()["shed_connections"] >= 1


@pytest.mark.parametrize("coding", [b"gzip, chunked", b"deflate,chunked", b"x-custom, chunked"])
def test_a_transfer_coding_other_than_chunked_is_refused_not_passed_as_plain(
        coding: bytes) -> None:
    with _gate() as g, socket.create_connection(("127.0.0.1", g.port), timeout=READ) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + coding
                  + b"\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
        out = _answer(s)
    assert out.startswith((b"HTTP/1.1 501", b"HTTP/1.1 400")), out[:300]
    assert _Vllm.seen == [], "vLLM got a body in a coding it was not told of"
