"""The gate against a fourth hostile review (gate and replay). Reproductions from the review;
each failed on the previous code."""

from __future__ import annotations

import json
import socket

import pytest

from tests.shell.test_gate_http import WAIT, _answer, _gate
from vllmwatch.gate.guard import MAX_BODY


def _head_answer(port: int, request: bytes) -> bytes:
    """The first answer head the gate sends for `request` (a head with no body sent)."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(request)
        got = b""
        while b"\r\n\r\n" not in got and (chunk := sock.recv(65536)):
            got += chunk
        return got


@pytest.mark.parametrize("path,headers,status", [
    ("/sleep", "Content-Length: 100\r\n", b"404"),
    ("/v1/completions", f"Content-Length: {MAX_BODY + 1}\r\n", b"413"),
    ("/v1/completions", "Transfer-Encoding: gzip, chunked\r\n", b"501"),
], ids=["path-off-the-list", "over-the-cap", "coding"])
def test_100_continue_is_not_sent_for_a_body_the_gate_refuses(path: str, headers: str,
                                                              status: bytes) -> None:
    """aiohttp's default expect handler sent `100 Continue` to every request before the
    gate's handler looked at it: a client (curl sends Expect for bodies over 1 MiB: an
    audio upload) was told to upload a body the gate then discarded with its 404 or 413."""
    with _gate(_answer()) as (gate, srv):
        got = _head_answer(gate.port, f"POST {path} HTTP/1.1\r\nHost: x\r\n{headers}"
                           "Expect: 100-continue\r\n\r\n".encode())
        assert got.startswith(b"HTTP/1.1 " + status), got[:200]
        assert srv.got == []


def test_an_unknown_expectation_is_refused_in_the_apis_shape_without_quoting_it() -> None:
    """aiohttp answered 417 "Unknown Expect: <the header>" as text: the client's bytes
    quoted back past the redactor, in no API's error shape."""
    with _gate(_answer()) as (gate, srv):
        with socket.create_connection(("127.0.0.1", gate.port), timeout=WAIT) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                         b"Expect: sk-secret-token-0123456789\r\nConnection: close\r\n\r\n{}")
            got = b""
            while chunk := sock.recv(65536):
                got += chunk
        assert got.startswith(b"HTTP/1.1 417"), got[:200]
        assert b"sk-secret" not in got, got
        assert json.loads(got.partition(b"\r\n\r\n")[2])["object"] == "error"
        assert srv.got == []
