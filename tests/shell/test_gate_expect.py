"""What the gate refuses from a request's head alone is answered before its `100 Continue`
and before a byte of its body is read, whether vLLM serves, starts or restarts (the request
held at the door): gate/head.py. Before, the API key was checked after the body: a client
with a wrong key that asked `Expect: 100-continue` (curl does for bodies over 1 MiB) was told
100 Continue, uploaded its whole body, waited at the door, and only then got its 401; so did
a request to a gate that was stopping (its 503), and CONNECT and OPTIONS * (no route: aiohttp's
own expect handler answered them before the gate's). A refusal whose body was not read
closes its connection: nothing the client sends after it is taken as a request. Raw sockets:
the order of the bytes on the wire is what is checked."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.shell.test_gate_api_key import KEY, _held_gate
from tests.shell.test_gate_http import WAIT
from tests.support import wait_until
from vllmwatch.gate.guard import MAX_BODY
from vllmwatch.gate.runner import Gate
from vllmwatch.status.snapshot import Snapshot

# A body that reads as a request: were it parsed as the next one, it would be answered.
SMUGGLED = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
SERVING = Snapshot(state="ready", ready=True, child_pid=7)
STARTING = Snapshot(state="starting", ready=False, child_pid=7)  # not yet up: held
RESTARTING = Snapshot(state="stopping", child_pid=7, restart_phase="stopping")  # held


@contextmanager
def _gate_in(state: str) -> Iterator[Gate]:
    """A gate over an engine enforcing KEY that serves, starts, or restarts (the old engine
    told to stop, the next one launched, not READY: its key is known, requests are held)."""
    with _held_gate() as (gate, snap):
        gate.forwarder.new_engine(7, KEY)
        if state == "serving":
            snap["now"] = SERVING
        elif state == "restarting":
            snap["now"] = RESTARTING
            gate.stop_order(7)
            gate.forwarder.new_engine(8, KEY)
        yield gate


def _head(path: str, key: str | None, headers: str = "", length: int | None = len(SMUGGLED)
          ) -> bytes:
    """A POST's head asking for 100 Continue (`length` None: no Content-Length)."""
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    sized = "" if length is None else f"Content-Length: {length}\r\n"
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}{sized}{headers}"
            "Expect: 100-continue\r\n\r\n").encode()


def _first_answer(sock: socket.socket) -> bytes:
    """Bytes up to the end of the first answer, a 100 included (its head and its
    Content-Length of body), or to EOF."""
    got = b""
    while True:
        head, sep, body = got.partition(b"\r\n\r\n")
        if sep:
            fields = {k.strip().lower(): v.strip() for k, _, v in (
                line.partition(b":") for line in head.split(b"\r\n")[1:])}
            if len(body) >= int(fields.get(b"content-length", b"0")):
                return got
        chunk = sock.recv(65536)
        if not chunk:
            return got
        got += chunk


def _to_eof(sock: socket.socket) -> bytes:
    got = b""
    with contextlib.suppress(ConnectionResetError):  # (the gate's close after unread bytes)
        while chunk := sock.recv(65536):
            got += chunk
    return got


def _refused_before_the_body(got: bytes, status: bytes) -> None:
    assert b"HTTP/1.1 100" not in got, got[:300]
    assert got.startswith(b"HTTP/1.1 " + status), got[:300]
    assert b"\r\nconnection: close\r\n" in got.partition(b"\r\n\r\n")[0].lower() + b"\r\n", got


def _no_leak(gate: Gate) -> None:
    """Every connection the gate held is gone, with no body nor request left held."""
    guard = gate.guard
    assert guard is not None
    wait_until(lambda: not guard.conns, WAIT, "the gate's connections closed")
    assert guard.held == 0 and gate.stats.holding == 0 and gate.stats.in_flight == 0


CASES = [("serving", "/score"), ("starting", "/score"), ("starting", "/v1/completions"),
         ("restarting", "/score"), ("restarting", "/v1/completions")]


@pytest.mark.parametrize(("state", "path"), CASES)
@pytest.mark.parametrize("key", [None, "sk-wrong"], ids=["no-key", "wrong-key"])
def test_a_refused_key_gets_its_401_before_100_continue_and_before_its_body(
        state: str, path: str, key: str | None) -> None:
    """The head alone: no body byte is ever sent; the 401 comes, and the connection closes
    (served: the gate's own key check, on the paths vLLM leaves open; held: the key of the
    engine it waits for, on every path)."""
    with _gate_in(state) as gate:
        with socket.create_connection(("127.0.0.1", gate.port), timeout=WAIT) as sock:
            sock.sendall(_head(path, key))
            got = _first_answer(sock)
            _refused_before_the_body(got, b"401")
            assert got.endswith(b'{"error": "Unauthorized"}'), got
        assert gate.stats.unauthorized == 1 and gate.stats.held == 0
        assert gate.stats.forwarded == 0
        _no_leak(gate)


@pytest.mark.parametrize("state", ["serving", "starting", "restarting"])
def test_a_body_sent_anyway_after_the_401_is_never_read_as_a_request(state: str) -> None:
    """curl sends the body after 1 s without a 100; a client may send its next request in
    its place instead. Either way (here a body that reads as a request) nothing more is
    answered, the connection ends, and the gate holds nothing of it."""
    with _gate_in(state) as gate:
        with socket.create_connection(("127.0.0.1", gate.port), timeout=WAIT) as sock:
            sock.sendall(_head("/score", "sk-wrong"))
            _refused_before_the_body(_first_answer(sock), b"401")
            with contextlib.suppress(OSError):  # (it may have closed already: its choice)
                sock.sendall(SMUGGLED)
            assert _to_eof(sock) == b""  # (a hang would be the socket's WAIT timeout)
        assert gate.stats.unauthorized == 1 and gate.stats.forwarded == 0
        _no_leak(gate)


@pytest.mark.parametrize("state", ["serving", "starting"])
@pytest.mark.parametrize("path", ["/score", "/v1/completions"])
def test_the_right_key_asking_100_continue_is_told_to_go_on_and_answered(state: str,
                                                                          path: str) -> None:
    """As before: 100 Continue (held or not), the body read, vLLM's answer once it serves."""
    with _held_gate() as (gate, snap):
        gate.forwarder.new_engine(7, KEY)
        if state == "serving":
            snap["now"] = SERVING
        with socket.create_connection(("127.0.0.1", gate.port), timeout=WAIT) as sock:
            sock.sendall(_head(path, KEY, "Connection: close\r\n", length=2))
            got = b""
            while b"\r\n\r\n" not in got and (chunk := sock.recv(65536)):
                got += chunk
            assert got.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), got[:300]
            sock.sendall(b"{}")
            if state == "starting":
                wait_until(lambda: gate.stats.holding == 1, WAIT, "the request held")
                snap["now"] = SERVING
            got += _to_eof(sock)
        answer = got.partition(b"\r\n\r\n")[2]
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok"), got[:300]
        assert gate.stats.unauthorized == 0


@pytest.mark.parametrize("state", ["serving", "starting", "restarting"])
@pytest.mark.parametrize(("path", "headers", "length", "status"), [
    ("/sleep", "", len(SMUGGLED), b"404"),
    ("/v1/completions", "", MAX_BODY + 1, b"413"),
    ("/v1/completions", "Transfer-Encoding: gzip, chunked\r\n", None, b"501"),
], ids=["path-off-the-list", "over-the-cap", "coding"])
def test_every_refusal_of_the_head_comes_before_100_continue_and_closes(
        state: str, path: str, headers: str, length: int | None, status: bytes) -> None:
    """The class, held or not: a refused path (which kept its connection open, the unread
    body to be taken from the client's next bytes), a body over the cap, a coding. A body
    that then comes whole is discarded, never answered, and the connection ends."""
    with _gate_in(state) as gate:
        with socket.create_connection(("127.0.0.1", gate.port), timeout=WAIT) as sock:
            sock.sendall(_head(path, KEY, headers, length))
            _refused_before_the_body(_first_answer(sock), status)
            if length == len(SMUGGLED):  # (else the client ends it, as Connection: close asks)
                with contextlib.suppress(OSError):
                    sock.sendall(SMUGGLED)
                assert _to_eof(sock) == b""
        assert gate.stats.forwarded == 0
        _no_leak(gate)


def test_a_stopping_gate_answers_503_before_100_continue() -> None:
    """vllmwatch stopping for good: its 503 came after the whole body was uploaded."""
    with _held_gate() as (gate, snap):
        snap["now"] = Snapshot(state="stopped")
        with socket.create_connection(("127.0.0.1", gate.port), timeout=WAIT) as sock:
            sock.sendall(_head("/v1/completions", KEY))
            got = _first_answer(sock)
        _refused_before_the_body(got, b"503")
        assert b"vllmwatch is stopping" in got and gate.stats.refused_closed == 1


@pytest.mark.parametrize("line", [b"OPTIONS * HTTP/1.1", b"CONNECT vllm:443 HTTP/1.1"])
@pytest.mark.parametrize("expect", [b"100-continue", b"sk-secret-expectation-0123456789"])
def test_a_request_with_no_path_is_refused_before_100_continue(line: bytes,
                                                               expect: bytes) -> None:
    """No route matched them: aiohttp's own expect handler sent 100 Continue before the
    gate's 404, or a 417 quoting the client's header back, as text."""
    with _gate_in("serving") as gate:
        with socket.create_connection(("127.0.0.1", gate.port), timeout=WAIT) as sock:
            sock.sendall(line + b"\r\nHost: x\r\nContent-Length: 5\r\nExpect: " + expect +
                         b"\r\n\r\n")
            got = _first_answer(sock)
        _refused_before_the_body(got, b"404")
        assert b"sk-secret" not in got and gate.stats.path_refused == 1


def test_a_refusal_with_no_body_to_come_keeps_its_connection() -> None:
    """Closing is for an unread body only: a bodiless refused request's connection serves
    the next request."""
    with _gate_in("serving") as gate, socket.create_connection(("127.0.0.1", gate.port),
                                                               timeout=WAIT) as sock:
        sock.sendall(b"GET /sleep HTTP/1.1\r\nHost: x\r\n\r\n")
        got = _first_answer(sock)
        assert got.startswith(b"HTTP/1.1 404"), got[:300]
        assert b"connection: close" not in got.lower(), got[:300]
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                     KEY.encode() + b"\r\nConnection: close\r\n\r\n")
        assert _to_eof(sock).startswith(b"HTTP/1.1 200")
