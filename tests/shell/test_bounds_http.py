"""Deadlines per operation and caps on bodies: the probes and the status CLI against peers
that trickle, announce huge bodies or stream for ever (fake servers on loopback)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from tests.support import TIMEOUT_SCALE
from vllmwatch import bounded_http
from vllmwatch.config.schema import ProbeConfig
from vllmwatch.shell.probes import Endpoint, HttpProber
from vllmwatch.status import cli as status_cli

Serve = Callable[[socket.socket, threading.Event], None]


@contextmanager
def peer(serve: Serve) -> Iterator[tuple[int, dict[str, int]]]:
    """A one-thread server; `serve(conn, stop)` writes what the scenario wants."""
    lsock = socket.create_server(("127.0.0.1", 0))
    stop, seen = threading.Event(), {"connections": 0, "sent": 0}

    def run() -> None:
        lsock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            seen["connections"] += 1
            with conn:
                conn.settimeout(10 * TIMEOUT_SCALE)
                try:
                    conn.recv(65536)
                    serve(conn, stop)
                except OSError:
                    pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield lsock.getsockname()[1], seen
    finally:
        stop.set()
        lsock.close()
        t.join(10)


def trickle(head: bytes, every: float = 0.05, total: int = 10_000) -> Serve:
    """Send `head`, then one body byte every `every` seconds, `total` of them."""
    def serve(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head)
        for _ in range(total):
            if stop.wait(every):
                return
            conn.sendall(b"x")
    return serve


def trickle_head(every: float = 0.05) -> Serve:
    """The status line itself one byte at a time, for ever."""
    def serve(conn: socket.socket, stop: threading.Event) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 100_000:
            if stop.wait(every):
                return
            conn.sendall(bytes([byte]))
    return serve


def sized(length: int, send: int) -> Serve:
    """Announce Content-Length `length`, send `send` bytes of it."""
    def serve(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {length}\r\n\r\n".encode())
        conn.sendall(b"a" * send)
    return serve


def endless_chunks(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"10000\r\n" + b"b" * 0x10000 + b"\r\n"
    while not stop.is_set():
        conn.sendall(chunk)


@pytest.mark.parametrize("serve", [trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n"),
                                   trickle_head()], ids=["body", "head"])
def test_a_trickling_peer_fails_at_the_total_deadline(serve: Serve) -> None:
    with peer(serve) as (port, _), pytest.raises(bounded_http.DeadlineExceeded, match=r"0\.5s"):
        bounded_http.request("127.0.0.1", port, "GET", "/", timeout=0.5, max_body=1 << 20)


@pytest.mark.parametrize("serve", [sized(1 << 30, 0), sized(2 << 20, 2 << 20), endless_chunks],
                         ids=["announced", "sent", "chunked"])
def test_a_body_over_the_cap_is_refused_not_loaded(serve: Serve) -> None:
    with peer(serve) as (port, _), pytest.raises(bounded_http.BodyTooLarge):
        bounded_http.request("127.0.0.1", port, "GET", "/", timeout=30 * TIMEOUT_SCALE,
                             max_body=1 << 20)


def test_a_body_at_the_cap_is_read() -> None:
    with peer(sized(1 << 20, 1 << 20)) as (port, _):
        status, body = bounded_http.request("127.0.0.1", port, "GET", "/",
                                            timeout=30 * TIMEOUT_SCALE, max_body=1 << 20)
    assert status == 200 and len(body) == 1 << 20


def _prober(port: int, timeout: float = 0.5) -> HttpProber:
    probe = ProbeConfig(timeout=timeout, canary_timeout=timeout)
    return HttpProber(Endpoint("127.0.0.1", port, "m"), probe)


def test_probes_fail_at_their_timeout_against_a_trickling_vllm() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n"
    with peer(trickle(head)) as (port, seen):
        health, metrics = _prober(port).health(), _prober(port).metrics()
        canary = _prober(port).canary()
    assert not health.ok and "timed out after 0.5s" in health.error
    assert not metrics.ok and "timed out after 0.5s" in metrics.error
    assert not canary.ok and canary.timed_out
    assert seen["connections"] == 3


def test_a_huge_metrics_body_is_a_failed_scrape() -> None:
    with peer(sized(1 << 30, 1 << 20)) as (port, _):
        result = _prober(port, timeout=30 * TIMEOUT_SCALE).metrics()
    assert not result.ok and "BodyTooLarge" in result.error and str(16 * 2**20) in result.error


def test_a_malformed_metrics_body_is_a_failed_scrape_without_a_traceback() -> None:
    body = b'vllm:num_requests_running{a="unterminated 1\n'
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()

    def serve(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head + body)

    with peer(serve) as (port, _):
        result = _prober(port).metrics()
    assert not result.ok and result.error.startswith("malformed /metrics"), result.error


def test_status_cli_gives_up_at_its_deadline_on_a_trickling_server(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(status_cli, "TIMEOUT_S", 0.5)
    with peer(trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n", every=0.2)) \
            as (port, _):
        code = status_cli.main(None, f"http://127.0.0.1:{port}", False)
    err = capsys.readouterr().err
    assert code == status_cli.EXIT_ERROR and "no complete answer within 0.5s" in err, err
