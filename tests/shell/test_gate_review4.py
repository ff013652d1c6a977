"""The gate against a fourth hostile review (gate and replay). Reproductions from the review;
each failed on the previous code."""

from __future__ import annotations

import json
import socket

import pytest

from tests.shell.test_gate_http import WAIT, _answer, _gate
from tests.support import wait_until
from vllmwatch.gate import guard as guardmod
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


def test_an_answer_still_going_out_to_a_slow_client_is_not_cut_as_idle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sized answer is written by aiohttp after the gate's handler returned (its
    connection idle from then on), and its last bytes wait in the socket's send queue for a
    slow client: the idle sweep aborted the connection IDLE_TIMEOUT after the handler
    ended, dropping the answer's unsent tail (the client got a truncated body, counted as
    an idle connection). A connection with bytes of its answer still going out is not
    idle while the client takes them (no byte for the deadline: cut, as before)."""
    idle = 3.0
    monkeypatch.setattr(guardmod, "IDLE_TIMEOUT", idle)
    monkeypatch.setattr(guardmod, "SWEEP_EVERY", 0.05)
    past: list[float] = []  # how far past its answer's end each pass saw the connection
    sweep = guardmod.Guard.sweep_once

    def spy(self: guardmod.Guard, now: float) -> None:
        past.extend(now - c.since for c in self.conns.values() if c.idle() and not c.silent)
        sweep(self, now)

    monkeypatch.setattr(guardmod.Guard, "sweep_once", spy)
    size = 3 * 2**20
    with _gate(_answer(body=b"x" * size)) as (gate, _srv):
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a slow client
            sock.settimeout(WAIT)
            sock.connect(("127.0.0.1", gate.port))
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            got = sock.recv(65536)
            wait_until(lambda: any(p > idle for p in past), WAIT, "a sweep past the deadline")
            head, _, body = got.partition(b"\r\n\r\n")
            while len(body) < size and (chunk := sock.recv(65536)):
                body += chunk
        assert len(body) == size, (len(body), head)
        assert gate.stats.idle_timeouts == 0
        with socket.create_connection(("127.0.0.1", gate.port), timeout=WAIT) as stalled:
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            # one that takes nothing more is still cut: the deadline bounds it, as before
            wait_until(lambda: gate.stats.idle_timeouts == 1, 4 * idle + WAIT, "the cut")
