"""Clients that never read their answers, and what the gate refuses: the connection is cut
and forgotten, never held past the caps (a hostile review: a client that stopped reading a
stream kept its connection slot for good; an unread whole answer kept its socket and its
bytes after the idle sweep let go of it; a 413 said `Connection: close` and served the next
pipelined request; a head of 128 8 KiB fields was accepted)."""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, ClassVar

import psutil
import pytest

from tests.support import TIMEOUT_SCALE, free_port, wait_for
from vllmwatch.gate import guard
from vllmwatch.gate.door import Readiness
from vllmwatch.gate.runner import Gate
from vllmwatch.shell import logs

READ = 20.0 * TIMEOUT_SCALE  # a socket's bound on an expected answer or close
REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
           b"\r\nContent-Length: 2\r\n\r\n{}")


class _Vllm(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[str]] = []
    big: ClassVar[bytes] = b""

    def do_POST(self) -> None:
        self.seen.append(self.path)
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.big:  # a whole answer of some MiB (embeddings)
            self._json(self.big)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        event = b'data: {"choices":[{"delta":{"content":"' + b"x" * 4000 + b'"}}]}\n\n'
        try:
            for _ in range(100_000):  # far more than any socket buffer holds
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        except OSError:
            return

    def do_GET(self) -> None:
        self.seen.append(self.path)
        self._json(b'{"object": "list", "data": []}')

    def _json(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_a: Any) -> None:
        return None


@contextmanager
def _gate(max_connections: int = 4, big: bytes = b"") -> Iterator[Gate]:
    _Vllm.seen, _Vllm.big = [], big
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Vllm)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    g = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{srv.server_address[1]}",
             lambda: Readiness.OPEN, 5.0, 1.0, max_connections=max_connections)
    g.start()
    try:
        yield g
    finally:
        g.stop()
        srv.shutdown()
        srv.server_close()
        thread.join(10 * TIMEOUT_SCALE)


def _reader(port: int) -> socket.socket:
    """A client that sends its request and never reads (a tiny receive window)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(REQUEST)
    return s


def _get(port: int, timeout: float = READ) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_clients_that_stop_reading_a_stream_are_cut_and_others_get_in(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard, "WRITE_STALL", 1.0)
    with _gate(max_connections=4) as g, ExitStack() as stack:
        for _ in range(4):  # as many as the cap, each with its stream in flight
            stack.callback(_reader(g.port).close)
        wait_for(lambda: g.snapshot()["in_flight"] == 4, 30, "4 streams in flight")
        # the writes stall (nobody reads): the gate cuts them, the slots come back
        wait_for(lambda: g.snapshot()["connections"] == 0, 60, "the stalled ones cut")
        assert _get(g.port).startswith(b"HTTP/1.1 200"), "a new client is served"
        assert g.snapshot()["in_flight"] == 0


def _gate_sockets(port: int) -> list[Any]:
    """This process's sockets on the gate's port (the gate runs on a thread of it)."""
    me = psutil.Process()
    conns = me.net_connections("tcp") if hasattr(me, "net_connections") else me.connections("tcp")
    return [c for c in conns if c.laddr and c.laddr[1] == port and c.status != "LISTEN"]


def test_an_unread_whole_answer_leaves_no_socket_after_the_idle_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("IDLE_TIMEOUT", 0.5), ("SWEEP_EVERY", 0.1)):
        monkeypatch.setattr(guard, name, value)
    # just under the gate's whole-answer size: written by aiohttp after the handler ends
    big = json.dumps({"data": ["y" * 1000] * 4000}).encode()
    with _gate(max_connections=4, big=big) as g, ExitStack() as stack:
        for _ in range(4):
            stack.callback(_reader(g.port).close)  # open, never read
        wait_for(lambda: len(_Vllm.seen) == 4, 30, "vLLM answered all 4")
        wait_for(lambda: g.snapshot()["idle_timeouts"] >= 4, 30, "the idle sweep")
        # the sweep let go of them: their sockets and unsent bytes go too (close() kept both
        # while the client did not read, uncounted, past max_connections)
        wait_for(lambda: not _gate_sockets(g.port), 30, "no gate socket left")


def test_a_refused_body_closes_the_connection_it_said_it_would() -> None:
    with _gate() as g, socket.create_connection(("127.0.0.1", g.port), timeout=READ) as s:
        huge = guard.MAX_BODY + 1
        # the body whole, then a pipelined request (the gate may close while it comes)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                      b"\r\n" % huge + b"x" * huge
                      + b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
        assert out.startswith(b"HTTP/1.1 413") and b"Connection: close" in out, out[:200]
        assert out.count(b"HTTP/1.1 ") == 1, out  # the pipelined request was not served
        assert _Vllm.seen == [], _Vllm.seen


def test_a_request_head_of_too_many_fields_is_refused() -> None:
    with _gate() as g, socket.create_connection(("127.0.0.1", g.port), timeout=READ) as s:
        fields = b"".join(b"X-F%d: v\r\n" % i for i in range(guard.MAX_HEADERS + 1))
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
        out = s.recv(65536)
        assert out.startswith((b"HTTP/1.1 400", b"HTTP/1.0 400")), out[:200]
        assert _Vllm.seen == []
    with _gate() as g:  # and a head within it is served
        assert _get(g.port).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("header", [
    b"Authorization: Bearer\r\n tok_live_4f9a8b7c6d5e4f3a2b1c",  # a folded line
    b"Authorization: Bearer\ttok_live_4f9a8b7c6d5e4f3a2b1c\x01",  # a tab, a control byte
    b"X-Api-Key: tok_live_4f9a8b7c6d5e4f3a2b1c\x01"])
def test_a_request_aiohttp_cannot_parse_is_logged_without_its_bytes(header: bytes) -> None:
    buf = io.StringIO()
    old = logging.root.handlers[:]
    logs.setup(fmt="json", stream=buf, environ={})
    try:
        with _gate() as g, socket.create_connection(("127.0.0.1", g.port), timeout=READ) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + header +
                      b"\r\nContent-Length: 2\r\n\r\n{}")
            assert s.recv(65536).startswith((b"HTTP/1.1 400", b"HTTP/1.0 400"))
            wait_for(lambda: "library.message" in buf.getvalue(), 20, "the parse error")
    finally:
        logging.root.handlers[:] = old
    said = [json.loads(line) for line in buf.getvalue().splitlines()
            if "library.message" in line]
    assert said and "BadHttpMessage: 400" in said[0]["error"], said
    assert "tok_live" not in buf.getvalue() and "not shown" in said[0]["error"], said
