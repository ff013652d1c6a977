"""The gate reaches vLLM where it listens: a wildcard host by the one mapping
(config/hosts.py), so an IPv6-only vLLM on "::" is reached on ::1, not on 127.0.0.1."""

from __future__ import annotations

import http.client
import http.server
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import pytest

from tests.support import TIMEOUT_SCALE, free_port, wait_for
from vllmwatch.config.schema import from_dict
from vllmwatch.core.restart import Phase
from vllmwatch.gate.runner import start_gate, upstream_of
from vllmwatch.status.snapshot import Snapshot


class _V6OnlyServer(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        super().server_bind()


class _Answer(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = b'{"choices": [{"text": "v6"}]}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_a: Any) -> None:
        return None


@contextmanager
def _ipv6_only_upstream() -> Iterator[int]:
    try:
        srv = _V6OnlyServer(("::1", 0), _Answer)
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(srv.server_address[1])
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(10 * TIMEOUT_SCALE)


@pytest.mark.parametrize("host,expected", [
    ("::", "http://[::1]:8000"), ("0.0.0.0", "http://127.0.0.1:8000"),
    ("", "http://127.0.0.1:8000"), ("::1", "http://[::1]:8000"),
    ("10.0.0.5", "http://10.0.0.5:8000"),
])
def test_the_upstream_follows_the_one_wildcard_mapping(host: str, expected: str) -> None:
    config = from_dict({"vllm": {"model": "m", "host": host, "port": 8000}})
    assert upstream_of(config) == expected


def test_the_gate_reaches_an_ipv6_only_vllm_on_the_wildcard() -> None:
    with _ipv6_only_upstream() as port:
        listen = f"127.0.0.1:{free_port()}"
        config = from_dict({"vllm": {"model": "m", "host": "::", "port": port},
                            "gate": {"enabled": True, "listen": listen}})
        errors: list[str] = []

        def log(level: str, event: str, **fields: Any) -> None:
            if level == "error":
                errors.append(f"{event} {fields}")

        gate = start_gate(config, log, lambda: Snapshot(state="ready", ready=True))
        assert gate is not None and not errors, errors
        try:
            conn = http.client.HTTPConnection("127.0.0.1", gate.port, timeout=20 * TIMEOUT_SCALE)
            conn.request("POST", "/v1/completions", b'{"prompt": "x"}',
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (200, b'{"choices": [{"text": "v6"}]}')
            conn.close()
        finally:
            gate.stop()


class _Counting(_Answer):
    seen: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        _Counting.seen.append(self.path)
        super().do_POST()


@pytest.mark.parametrize("phase", [p.value for p in Phase if p is not Phase.IDLE])
def test_nothing_new_goes_to_an_engine_once_its_restart_has_begun(phase: str) -> None:
    """Whatever the rung and whatever the coarse state says (a crash's RECORDING keeps
    "ready" while its engine is dead), a request that arrives once restart.begin is
    published waits at the door and goes to the next engine only."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    _Counting.seen = []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    snap = {"now": Snapshot(state="ready", ready=True, child_pid=100, restart_phase=phase)}
    reads = [0]  # the gate's looks at the snapshot: proof that it had its chance to send

    def look() -> Snapshot:
        reads[0] += 1
        return snap["now"]

    config = from_dict({"vllm": {"model": "m", "host": "127.0.0.1",
                                 "port": int(srv.server_address[1])},
                        "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}"}})
    gate = start_gate(config, lambda *_a, **_k: None, look)
    assert gate is not None
    answer: dict[str, Any] = {}

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", gate.port, timeout=60 * TIMEOUT_SCALE)
        conn.request("POST", "/v1/completions", b'{"prompt": "x"}',
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        answer["got"] = (resp.status, resp.read())
        conn.close()

    sender = threading.Thread(target=client, daemon=True)
    try:
        sender.start()
        wait_for(lambda: gate.forwarder.stats.held == 1, 30, "the request held at the door")
        seen = reads[0]
        wait_for(lambda: reads[0] >= seen + 4, 30, "the door looked again, twice or more")
        assert _Counting.seen == [] and "got" not in answer
        snap["now"] = Snapshot(state="ready", ready=True, child_pid=101)  # the next engine
        sender.join(30 * TIMEOUT_SCALE)
        assert answer.get("got") == (200, b'{"choices": [{"text": "v6"}]}')
        assert _Counting.seen == ["/v1/completions"]
    finally:
        gate.stop()
        srv.shutdown()
        srv.server_close()
        thread.join(10 * TIMEOUT_SCALE)


class _Headers(_Answer):
    seen: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:
        _Headers.seen.append({k.lower(): v for k, v in self.headers.items()})
        super().do_POST()


@pytest.mark.parametrize("sent", [
    {},  # a bare client (curl -H 'User-Agent:' style, raw sockets)
    {"User-Agent": "my-client/1.0", "Accept-Encoding": "identity"},
], ids=["bare", "own"])
def test_the_gate_adds_no_header_the_client_did_not_send(sent: dict[str, str]) -> None:
    """aiohttp's client adds User-Agent (Python/aiohttp), Accept, Accept-Encoding: gzip,
    deflate and Content-Type: application/octet-stream to what the gate forwards: vLLM's
    access log named the gate, not the client, and a vLLM behind compression would answer
    gzip to a client that never asked (the gate passes bodies through undecoded). What vLLM
    gets is what the client sent, hop-by-hop aside."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Headers)
    _Headers.seen = []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    config = from_dict({"vllm": {"model": "m", "host": "127.0.0.1",
                                 "port": int(srv.server_address[1])},
                        "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}"}})
    gate = start_gate(config, lambda *_a, **_k: None,
                      lambda: Snapshot(state="ready", ready=True))
    assert gate is not None
    try:
        with socket.create_connection(("127.0.0.1", gate.port), timeout=30 * TIMEOUT_SCALE) as sock:
            body = b'{"prompt": "x"}'
            head = "".join(f"{k}: {v}\r\n" for k, v in sent.items())
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: vllm\r\nContent-Length: "
                         f"{len(body)}\r\n{head}Connection: close\r\n\r\n".encode() + body)
            got = b""
            while chunk := sock.recv(65536):
                got += chunk
        assert got.startswith(b"HTTP/1.1 200"), got[:200]
        assert len(_Headers.seen) == 1
        seen = _Headers.seen[0]
        for name in ("user-agent", "accept", "accept-encoding", "content-type"):
            want = {k.lower(): v for k, v in sent.items()}.get(name)
            assert seen.get(name) == want, f"{name}: vLLM got {seen.get(name)!r}, sent {want!r}"
    finally:
        gate.stop()
        srv.shutdown()
        srv.server_close()
        thread.join(10 * TIMEOUT_SCALE)
