"""The gate sends a request to vLLM once (a hostile review, 2026-12-05).

aiohttp re-sent an idempotent method (GET, DELETE, PUT, ...) on a new connection when vLLM
closed the first one unanswered, although vLLM had read it: behind the gate's replay rules,
its fence and its counters. A DELETE ran twice; a GET reached an engine after its stop
order, counted nowhere."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.support import TIMEOUT_SCALE, free_port, wait_for
from tests.support.rawhttp import raw_upstream
from vllmwatch.gate.door import Readiness
from vllmwatch.gate.runner import Gate

OK = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
      b"Connection: close\r\n\r\n{}")


def _exchange(port: int, request: bytes) -> bytes:
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30 * TIMEOUT_SCALE) as s:
        s.sendall(request)
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_a_request_vllm_read_and_never_answered_is_not_sent_again() -> None:
    def answer(conn: socket.socket, n: int) -> None:
        if n > 1:  # (the first: read, then closed unanswered: vLLM's process died)
            conn.sendall(OK)

    with raw_upstream(answer) as (port, seen):
        g = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{port}",
                 lambda: Readiness.OPEN, 3.0, 1.0)
        g.start()
        try:
            out = _exchange(g.port, b"DELETE /v1/responses/resp_1 HTTP/1.1\r\nHost: x\r\n"
                                    b"Connection: close\r\n\r\n")
        finally:
            g.stop()
    assert len(seen) == 1, f"vLLM received it {len(seen)} times"
    assert out.startswith(b"HTTP/1.1 502"), out[:60]


def test_nothing_reaches_an_engine_after_its_stop_order() -> None:
    holder: dict[str, Gate] = {}
    after_stop: list[int] = []

    def answer(conn: socket.socket, n: int) -> None:
        if n == 1:  # vllmwatch tells engine 7 to stop; it dies with the request read
            holder["g"].stop_order(7)
            return
        after_stop.append(n)
        conn.sendall(OK)

    with raw_upstream(answer) as (port, _):
        g = holder["g"] = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{port}",
                               lambda: Readiness.OPEN, 3.0, 1.0, generation=lambda: 7)
        g.start()
        try:
            _exchange(g.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            snap = g.snapshot()
        finally:
            g.stop()
    assert not after_stop and snap["forwarded_after_stop"] == 0, (after_stop, snap)


def test_a_request_that_never_connected_is_not_counted_sent_after_a_stop_order() -> None:
    """`forwarded_after_stop` (a defect: must stay 0) counted a connect still pending when the
    stop order's wait ran out, which then failed: nothing had reached vLLM."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)  # the listen queue full: the gate's SYN is dropped, its connect pends
    fillers = []
    for _ in range(3):
        c = socket.socket()
        c.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            c.connect(srv.getsockname())
        fillers.append(c)
    g = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{srv.getsockname()[1]}",
             lambda: Readiness.OPEN, 8.0, 1.0, generation=lambda: 7)
    g.start()
    out: list[bytes] = []
    try:
        client = threading.Thread(target=lambda: out.append(_exchange(
            g.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")))
        client.start()
        wait_for(lambda: g.snapshot()["in_flight"] == 1, 30, "the send under way")
        g.stop_order(7)  # its wait for the pending send runs out; then "SIGTERM"
        client.join(60 * TIMEOUT_SCALE)
        snap = g.snapshot()
    finally:
        g.stop()
        srv.close()
        for c in fillers:
            c.close()
    assert out and out[0].startswith(b"HTTP/1.1 503"), out
    assert snap["forwarded"] == 0 and snap["forwarded_after_stop"] == 0, snap
