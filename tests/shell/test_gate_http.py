"""The gate's HTTP semantics against a raw upstream that records the bytes it got (a hostile
review of the gate): hop-by-hop headers, those named by Connection included, never cross it in
either direction; Expect is met on the client's hop (forwarded, aiohttp's client waited for
vLLM's 100 for good); HEAD keeps vLLM's Content-Length; a gzip body reaches vLLM as sent (it
went on decoded, still labelled gzip); the query string is forwarded byte for byte; an
answer whose head cannot be read is vLLM's 502, not its engine's death (it was replayed)."""

from __future__ import annotations

import gzip
import socket
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.support import TIMEOUT_SCALE, free_port
from tests.support.rawhttp import read_request
from vllmwatch.config.schema import from_dict
from vllmwatch.gate.runner import Gate, start_gate
from vllmwatch.status.snapshot import Snapshot

WAIT = 30.0 * TIMEOUT_SCALE  # each wait is on an expected event: a loaded box is slow


class _Upstream(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, answer: bytes) -> None:
        super().__init__(("127.0.0.1", 0), _Record)
        self.answer = answer
        self.got: list[bytes] = []


class _Record(socketserver.BaseRequestHandler):
    server: _Upstream

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(WAIT)
        got = read_request(sock)
        if got is None:
            return
        head, body = got
        self.server.got.append(head + b"\r\n\r\n" + body)
        sock.sendall(self.server.answer)


def _answer(headers: str = "", body: bytes = b"ok", length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return (f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {size}\r\n"
            f"{headers}Connection: close\r\n\r\n").encode() + body


@contextmanager
def _gate(answer: bytes) -> Iterator[tuple[Gate, _Upstream]]:
    srv = _Upstream(answer)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    config = from_dict({"vllm": {"model": "m", "host": "127.0.0.1",
                                 "port": int(srv.server_address[1])},
                        "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}",
                                 "hold_timeout": "3s"}})
    gate = start_gate(config, lambda *_a, **_k: None,
                      lambda: Snapshot(state="ready", ready=True, child_pid=7))
    assert gate is not None
    try:
        yield gate, srv
    finally:
        gate.stop()
        srv.shutdown()
        srv.server_close()
        thread.join(10 * TIMEOUT_SCALE)


def _send(gate: Gate, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", gate.port), timeout=WAIT) as sock:
        sock.sendall(request)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    return got


def _head_of(raw: bytes) -> dict[str, str]:
    lines = raw.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)}


def _post(path: str = "/v1/completions", headers: str = "", body: bytes = b'{"p": 1}',
          method: str = "POST") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: vllm\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{headers}Connection: close\r\n\r\n").encode() + body


@pytest.mark.parametrize("named", ["X-Hop, close", "close, x-hop, Keep-Alive", "close,X-HOP"])
def test_headers_the_connection_header_names_never_cross_either_way(named: str) -> None:
    answer = _answer(f"Connection: {named}\r\nX-Hop: upstream-only\r\n"
                     "Proxy-Connection: keep-alive\r\n")
    # (the upstream's own Connection header: close then its named one)
    answer = answer.replace(b"Connection: close\r\n\r\n", b"\r\n")
    with _gate(answer) as (gate, srv):
        got = _send(gate, _post(headers=f"X-Hop: client-only\r\nProxy-Connection: keep-alive\r\n"
                                        f"Connection: {named}\r\n").replace(
            b"Connection: close\r\n\r\n", b"\r\n"))
        assert got.startswith(b"HTTP/1.1 200"), got[:200]
        upstream = _head_of(srv.got[0])
        assert "x-hop" not in upstream and "proxy-connection" not in upstream, upstream
        client = _head_of(got)
        assert "x-hop" not in client and "proxy-connection" not in client, client


def test_an_expect_100_continue_is_met_on_the_clients_hop() -> None:
    """The raw upstream never sends 100 Continue: forwarded, Expect held the body for good."""
    with _gate(_answer()) as (gate, srv):
        with socket.create_connection(("127.0.0.1", gate.port), timeout=WAIT) as sock:
            body = b'{"p": 1}'
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: vllm\r\nContent-Length: "
                         f"{len(body)}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
                         .encode())
            first = sock.recv(65536)
            assert first.startswith(b"HTTP/1.1 100"), first
            sock.sendall(body)
            got = b""
            while chunk := sock.recv(65536):
                got += chunk
        assert b"HTTP/1.1 200" in got and got.endswith(b"ok"), got
        assert "expect" not in _head_of(srv.got[0]) and srv.got[0].endswith(body)


def test_head_keeps_vllms_content_length_and_sends_no_body() -> None:
    with _gate(_answer(length=1234, body=b"")) as (gate, srv):
        got = _send(gate, b"HEAD /v1/models HTTP/1.1\r\nHost: vllm\r\nConnection: close\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 200"), got
        assert _head_of(got).get("content-length") == "1234", got
        assert got.endswith(b"\r\n\r\n"), got
        assert srv.got[0].startswith(b"HEAD /v1/models ")


def test_a_gzip_body_reaches_vllm_as_the_client_sent_it() -> None:
    body = gzip.compress(b'{"prompt": "hello"}')
    with _gate(_answer()) as (gate, srv):
        got = _send(gate, _post(headers="Content-Encoding: gzip\r\n", body=body))
        assert got.startswith(b"HTTP/1.1 200"), got[:200]
        head, _, seen = srv.got[0].partition(b"\r\n\r\n")
        assert seen == body and _head_of(head + b"\r\n\r\n")["content-encoding"] == "gzip"


@pytest.mark.parametrize("query", ["a=%41&b=%2F&g=%zz&i=%7e&l=[]&o=%e9", "x=1+2&y=%2B%26"])
def test_the_query_string_is_forwarded_byte_for_byte(query: str) -> None:
    with _gate(_answer()) as (gate, srv):
        got = _send(gate, _post(path=f"/v1/completions?{query}"))
        assert got.startswith(b"HTTP/1.1 200"), got[:200]
        assert srv.got[0].startswith(f"POST /v1/completions?{query} HTTP/1.1".encode())


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_an_answer_whose_head_cannot_be_read_is_a_502_not_an_engine_death(method: str) -> None:
    """A header over aiohttp's 8190 bytes: it was taken for the engine's death, replayed, and
    held to the hold timeout (503 after 3 s) or answered 502 "failed before answering"."""
    big = _answer(f"X-Big: {'x' * 9000}\r\n")
    with _gate(big) as (gate, srv):
        got = _send(gate, _post(method=method) if method == "POST" else
                    b"GET /v1/models HTTP/1.1\r\nHost: vllm\r\nConnection: close\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 502"), got[:300]
        assert b"could not be read" in got and b"not sent again" in got, got
        stats: dict[str, Any] = gate.stats.__dict__
        assert stats["replayed"] == 0 and stats["failed_midrequest"] == 0, stats
        assert len(srv.got) == 1


@pytest.mark.parametrize("sent", ["", "X-Forwarded-For: 10.9.8.7\r\nX-Forwarded-Proto: https\r\n"])
def test_vllm_is_told_who_the_gate_forwards_for_never_what_a_client_claims(sent: str) -> None:
    """vLLM's uvicorn believes X-Forwarded-* from 127.0.0.1, which is the gate: a client's
    own header would have put any address in vLLM's log."""
    with _gate(_answer()) as (gate, srv):
        got = _send(gate, _post(headers=sent))
        assert got.startswith(b"HTTP/1.1 200"), got[:200]
        upstream = _head_of(srv.got[0])
        assert upstream["x-forwarded-for"] == "127.0.0.1", upstream
        assert upstream["x-forwarded-proto"] == "http", upstream
