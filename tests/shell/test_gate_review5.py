"""A fifth review of the gate (2026-12-06): the cap's pick closed as idle a connection whose
answer was still going out to its client (the sweep no longer did); a client that left
mid-upload was logged as an error of the library; bytes pipelined behind an upgrade request
were swallowed, never answered."""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import struct

import pytest

from tests.shell import test_gate_http
from tests.shell.test_gate_http import WAIT, _answer, _gate
from tests.support import wait_until
from vllmwatch.gate import guard as guardmod
from vllmwatch.shell import logs


def test_at_the_cap_a_connection_still_delivering_its_answer_is_not_the_one_closed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At the cap the longest-idle connection made room even while its client was still
    taking its answer (a sized answer is written after the handler returned): it was
    aborted, the client got a truncated body. The cap's pick asks what the sweep asks: a
    silent connection younger than it is closed instead."""
    monkeypatch.setattr(guardmod, "HEADER_TIMEOUT", 10 * WAIT)  # (the silent one stays)
    size = 3 * 2**20
    with _gate(_answer(body=b"x" * size)) as (gate, _srv):
        wait_until(lambda: gate.guard is not None, WAIT, "the guard")
        assert gate.guard is not None
        guard = gate.guard
        guard.max_connections = 2
        with socket.socket() as slow:
            slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # takes it slowly
            slow.settimeout(WAIT)
            slow.connect(("127.0.0.1", gate.port))
            slow.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            got = slow.recv(65536)
            # its handler returned: idle to the guard, its answer still going out
            wait_until(lambda: len(guard.conns) == 1 and all(
                c.idle() for c in list(guard.conns.values())) and
                gate.stats.in_flight == 0, WAIT, "the answer handed to aiohttp")
            with socket.create_connection(("127.0.0.1", gate.port), timeout=WAIT) as silent:
                wait_until(lambda: len(guard.conns) == 2, WAIT, "the silent one")
                with socket.create_connection(("127.0.0.1", gate.port), timeout=WAIT):
                    wait_until(lambda: gate.stats.idle_timeouts == 1, WAIT, "room made")
                    assert silent.recv(1) == b"", "the silent connection made room"
            head, _, body = got.partition(b"\r\n\r\n")
            while len(body) < size and (chunk := slow.recv(65536)):
                body += chunk
        assert len(body) == size, (len(body), head)
        assert gate.stats.shed_connections == 0


@pytest.mark.parametrize("reset", [False, True])
def test_a_client_that_leaves_mid_upload_is_counted_not_logged_as_an_error(
        reset: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that closed (or reset) its connection in the middle of its body made aiohttp
    log "Error handling request" (ConnectionResetError: Connection lost) through the bridge
    as an error-level library.message: the client's doing, never vllmwatch's error. It is
    counted (clients_left) and logged at debug as gate.client_left."""
    events: list[tuple[str, str]] = []
    real = test_gate_http.start_gate
    monkeypatch.setattr(test_gate_http, "start_gate", lambda config, _log, snap: real(
        config, lambda level, event, **_k: events.append((level, event)), snap))
    buf = io.StringIO()
    old = logging.root.handlers[:]
    logs.setup(fmt="json", stream=buf, environ={})  # the bridge of the libraries' loggers
    try:
        with _gate(_answer()) as (gate, srv):
            with socket.create_connection(("127.0.0.1", gate.port), timeout=WAIT) as sock:
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Length: 1000\r\n\r\n{\"prompt\": ")
                guard = gate.guard
                wait_until(lambda: guard is not None and any(
                    c.busy for c in list(guard.conns.values())), WAIT, "the body being read")
                if reset:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            wait_until(lambda: getattr(gate.stats, "clients_left", 0) == 1 or
                       "library.message" in buf.getvalue(), WAIT, "the client's leaving seen")
            assert "library.message" not in buf.getvalue(), buf.getvalue()
            assert gate.stats.clients_left == 1 and srv.got == []
    finally:
        logging.root.handlers[:] = old
    assert ("debug", "gate.client_left") in events, events


_H2C = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nContent-Length: 2\r\n\r\n{}")


@pytest.mark.parametrize("first", [
    _H2C,  # curl --http2 on an http:// URL sends it on every request
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"])
def test_a_request_pipelined_behind_an_upgrade_is_answered_or_its_connection_closed(
        first: bytes) -> None:
    """aiohttp's parser stops at a request asking to switch protocols (llhttp pauses there):
    the gate answered it, then swallowed the bytes pipelined behind it, never answered, and
    kept the connection open. The gate speaks HTTP/1.1 only: it answers the request and
    closes the connection, so the client knows the rest was not answered."""
    with _gate(_answer()) as (gate, _srv):
        with socket.create_connection(("127.0.0.1", gate.port), timeout=WAIT) as sock:
            sock.sendall(first + b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(65536):  # (a timeout: neither answer nor close)
                    got += chunk
        assert got.startswith(b"HTTP/1.1 "), got[:200]
        answers = got.count(b"HTTP/1.1 ")
        assert answers in (1, 2), got  # the first; the second only if it was read
