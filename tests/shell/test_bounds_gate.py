"""Bounds of the [gate] against its clients: connections, idle, header and body deadlines,
body and held-bytes caps, and vLLM's answer deadline (in process, loopback, small caps)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from tests.support import TIMEOUT_SCALE, free_port, wait_for
from vllmwatch.gate import exchange, guard
from vllmwatch.gate.door import Readiness
from vllmwatch.gate.runner import Gate


@contextmanager
def gate(state: Readiness = Readiness.CLOSED, upstream: int = 1, **kwargs: object
         ) -> Iterator[tuple[Gate, list[tuple[str, dict[str, object]]]]]:
    events: list[tuple[str, dict[str, object]]] = []
    g = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{upstream}", lambda: state, 30.0,
             1.0, log=lambda level, event, **kw: events.append((event, kw)),
             **kwargs)  # type: ignore[arg-type]
    g.start()
    try:
        yield g, events
    finally:
        g.stop()


def _post(g: Gate, body: bytes, timeout: float = 20.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(20 * TIMEOUT_SCALE)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deadlines of a fraction of a second and caps of a few MiB, so the tests are quick."""
    for name, value in (("IDLE_TIMEOUT", 0.5), ("HEADER_TIMEOUT", 0.5), ("BODY_TIMEOUT", 0.5),
                        ("SWEEP_EVERY", 0.1), ("MAX_BODY", 1 << 20), ("MAX_HELD", 2 << 20)):
        monkeypatch.setattr(guard, name, value)


def test_connections_past_the_cap_are_shed_with_503_and_counted() -> None:
    """None of the 8 is idle (each has begun a request head): the newcomer is shed. (An
    idle one makes room instead: tests/shell/test_gate_review3.py.)"""
    with gate(max_connections=8) as (g, events), ExitStack() as stack:
        idle = [stack.enter_context(socket.create_connection(("127.0.0.1", g.port)))
                for _ in range(8)]
        for sock in idle:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\n")  # a head begun, not complete
        wait_for(lambda: g.snapshot()["connections"] == 8, 10, "8 connections tracked")
        code, body = _post(g, b"{}")
        assert code == 503 and b"too many clients" in body
        assert g.snapshot()["shed_connections"] == 1
        for sock in idle:
            sock.close()
        wait_for(lambda: g.snapshot()["connections"] == 0, 10, "the idle ones to go")
        code, body = _post(g, b"{}")
        assert code == 503 and b"stopping" in body  # through the door again: not shed
    assert [e for e, _ in events].count("gate.refused") >= 1


@pytest.mark.usefixtures("fast")
def test_an_idle_connection_is_closed_at_the_idle_deadline() -> None:
    with gate() as (g, _), socket.create_connection(("127.0.0.1", g.port)) as sock:
        assert _closed_by_peer(sock)
        assert g.snapshot()["idle_timeouts"] == 1


@pytest.mark.usefixtures("fast")
def test_a_trickling_header_is_cut_at_the_header_deadline() -> None:
    with gate() as (g, _), socket.create_connection(("127.0.0.1", g.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        stop = threading.Event()

        def trickle() -> None:
            while not stop.wait(0.1):
                try:
                    sock.sendall(b"X-a: b\r\n")
                except OSError:
                    return

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        try:
            assert _closed_by_peer(sock)
        finally:
            stop.set()
            t.join(5)
        assert g.snapshot()["header_timeouts"] == 1


@pytest.mark.usefixtures("fast")
def test_a_body_over_the_cap_is_413_announced_or_chunked() -> None:
    # (held, not CLOSED: a stopping gate answers 503 from the head, its body never read)
    with gate(Readiness.HOLD) as (g, _):
        code, body = _post(g, b"x" * ((1 << 20) + 1))
        assert code == 413 and b"over the gate's cap" in body
        conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=20 * TIMEOUT_SCALE)
        conn.request("POST", "/v1/completions", iter([b"y" * 65536] * 20),
                     {"Content-Type": "application/json"}, encode_chunked=True)
        assert conn.getresponse().status == 413
        conn.close()
        assert g.snapshot()["too_large"] == 2


@pytest.mark.usefixtures("fast")
def test_a_slow_body_is_408_at_the_body_deadline() -> None:
    with gate(Readiness.HOLD) as (g, _), socket.create_connection(("127.0.0.1", g.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nab")
        sock.settimeout(20 * TIMEOUT_SCALE)
        assert sock.recv(65536).startswith(b"HTTP/1.1 408")
        assert g.snapshot()["body_timeouts"] == 1


@pytest.mark.usefixtures("fast")
def test_bodies_held_while_vllm_starts_are_capped_in_all() -> None:
    with gate(Readiness.HOLD) as (g, _):
        answers: list[int] = []
        body = b"z" * (900 << 10)

        def hold() -> None:
            try:
                answers.append(_post(g, body, 60)[0])
            except (OSError, http.client.HTTPException):
                answers.append(0)  # cut when the gate stops: expected here

        holders = [threading.Thread(target=hold, daemon=True) for _ in range(2)]
        for t in holders:
            t.start()
        wait_for(lambda: g.snapshot()["holding"] == 2, 20, "two bodies held at the door")
        code, text = _post(g, body)
        assert code == 503 and b"holds" in text
        snap = g.snapshot()
        assert snap["held_full"] == 1 and snap["held_bytes"] <= 2 << 20
        g.stop()
        for t in holders:
            t.join(20 * TIMEOUT_SCALE)
        assert len(answers) == 2


def test_a_trickling_vllm_answer_is_504_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exchange, "WHOLE_BODY_TIMEOUT", 0.5)
    lsock = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def vllm() -> None:
        conn, _ = lsock.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
            while not stop.wait(0.1):
                try:
                    conn.sendall(b"x")
                except OSError:
                    return

    t = threading.Thread(target=vllm, daemon=True)
    t.start()
    try:
        with gate(Readiness.OPEN, upstream=lsock.getsockname()[1]) as (g, _):
            code, body = _post(g, json.dumps({"prompt": "x"}).encode())
            assert code == 504 and g.snapshot()["upstream_timeouts"] == 1, body
    finally:
        stop.set()
        lsock.close()
        t.join(5)
