"""What one status client sends never touches another's connection, nor floods the log.

A request line urlsplit cannot read (`GET http://[ HTTP/1.0`) raised out of the front
thread's turn after it had drained its wake-up: the probes queued behind it were never read
(no answer, no deadline), the bad socket was never closed, and each such request logged an
error event, so any local user could push vllmwatch's own events past journald's rate limit.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from tests.shell.test_status_guard import Gated, gated
from tests.support import TIMEOUT_SCALE, wait_for
from vllmwatch.status import server as status_server
from vllmwatch.status.front import MAX_HEAD, Front

PROBE = b"GET /livez HTTP/1.0\r\n\r\n"
MALFORMED = [
    b"GET http://[ HTTP/1.0",  # urlsplit: ValueError('Invalid IPv6 URL')
    b"GET //[x HTTP/1.0",
    b"GET [ HTTP/1.0",  # a bare bracket: no netloc, read as a path
    b"GET /\xff\xfe\xc3( HTTP/1.0",  # not UTF-8, not ASCII
    b"GET /%zz%ff% HTTP/1.0",  # escapes that do not decode
    b"GET /\x00 HTTP/1.0",
    b"GET /" + b"a" * (MAX_HEAD - 100) + b" HTTP/1.0",  # long, but within the head's cap
    b"GET /" + b"a" * (2 * MAX_HEAD) + b" HTTP/1.0",  # over the cap: 431
    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",  # a TLS hello
    b"GET /livez",  # HTTP/0.9
]


def _front(g: Gated) -> Front:
    httpd = g.server._httpd
    assert httpd is not None
    return httpd.front


# How long a read waits for a reply the server should give (a timeout raises: no answer),
# scaled for a loaded box.
REPLY = 5.0 * TIMEOUT_SCALE


def _reply(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a timeout raises: no answer)."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


@contextmanager
def _held_turn(g: Gated) -> Iterator[threading.Event]:
    """Hold the front thread at the end of its next turn until the yielded event is set, so
    that connections made meanwhile are queued together and taken in one turn."""
    held, release = threading.Event(), threading.Event()
    tick = g.server.tick

    def holding(now: float) -> None:
        if not held.is_set():
            held.set()
            release.wait(10 * TIMEOUT_SCALE)
        tick(now)

    g.server.tick = holding  # type: ignore[method-assign]  # the front calls app.tick
    _front(g)._wake()  # a turn now, not at the idle second's end
    wait_for(held.is_set, 5, "the front thread to reach its tick")
    try:
        yield release
    finally:
        release.set()


def _queued_behind(g: Gated, first: bytes, stack: ExitStack) -> tuple[bytes, bytes]:
    """(the reply to `first`, the reply to a probe queued right behind it in one turn)."""
    with _held_turn(g) as release:
        bad = stack.enter_context(socket.create_connection(g.server.address, timeout=REPLY))
        bad.sendall(first + b"\r\n\r\n")
        good = stack.enter_context(socket.create_connection(g.server.address, timeout=REPLY))
        good.sendall(PROBE)
        wait_for(lambda: _front(g)._incoming.qsize() == 2, 5, "both to be queued")
        release.set()
        return _reply(bad), _reply(good)


def _failures(g: Gated) -> list[tuple[str, dict[str, Any]]]:
    return [(ev, kw) for ev, kw in g.events if ev.endswith("_failed")]


def test_a_bad_request_line_strands_no_probe_queued_behind_it() -> None:
    with gated() as g, ExitStack() as stack:
        bad, good = _queued_behind(g, b"GET http://[ HTTP/1.0", stack)
        assert good.startswith(b"HTTP/1.0 200 OK\r\n") and good.endswith(b"ok\n"), good
        assert bad.startswith(b"HTTP/1.0 400 Bad Request\r\n"), bad
        assert g.server.rejections.snapshot()["bad_request"] == 1
        assert g.server.waiting == 0
    assert _failures(g) == []
    assert [ev for ev, _ in g.events] == ["status.listening", "status.rejected",
                                         "status.stopped"]


def test_a_flood_of_bad_lines_logs_a_bounded_number_of_events_and_every_probe_answers() -> None:
    with gated() as g, ExitStack() as stack:
        bad: list[socket.socket] = []
        good: list[socket.socket] = []
        for i in range(200):  # all open at once: bad and good share the front's turns
            sock = stack.enter_context(socket.create_connection(g.server.address, timeout=REPLY))
            sock.sendall(b"GET //[x HTTP/1.0\r\n\r\n")
            bad.append(sock)
            if i % 10 == 0:
                sock = stack.enter_context(socket.create_connection(g.server.address,
                                                                    timeout=REPLY))
                sock.sendall(PROBE)
                good.append(sock)
        assert all(_reply(s).startswith(b"HTTP/1.0 200 OK\r\n") for s in good)
        assert all(_reply(s).startswith(b"HTTP/1.0 400 ") for s in bad)
        assert g.server.rejections.snapshot()["bad_request"] == 200
    assert _failures(g) == []
    rejected = [kw["counts"] for ev, kw in g.events if ev == "status.rejected"]
    assert 1 <= len(rejected) <= 2 and sum(c["bad_request"] for c in rejected) == 200
    assert len(g.events) <= 5, g.events  # listening, rejected twice, stopped


def test_malformed_request_lines_are_each_answered_and_never_disturb_a_probe() -> None:
    answers = []
    with gated() as g, ExitStack() as stack:
        g.gate.set()  # handlers run freely
        for line in MALFORMED:
            bad, good = _queued_behind(g, line, stack)
            assert good.startswith(b"HTTP/1.0 200 OK\r\n"), (line[:40], good)
            assert bad[:9] == b"HTTP/1.0 " and bad[9:10] == b"4", (line[:40], bad)
            answers.append(int(bad[9:12]))
        wait_for(lambda: g.server.slots.active == 0 and g.server.waiting == 0, 5,
                 "every connection to be done with")
    assert answers == [400, 400, 404, 404, 404, 404, 404, 431, 400, 400]
    assert _failures(g) == []


def test_an_exception_in_the_front_turn_is_logged_at_a_bounded_rate() -> None:
    turns = []
    with gated() as g:
        def broken(now: float) -> None:
            turns.append(now)
            raise RuntimeError("tick")

        g.server.tick = broken  # type: ignore[method-assign]  # raises at every turn's end
        for _ in range(20):  # each probe is a turn: answered, then the turn raises
            assert g.request("/livez")[0] == 200
        # the answer leaves before its turn ends: a stop right after the 20th could beat
        # that turn's raise on a loaded box (counted 19 once)
        wait_for(lambda: len(turns) >= 20, 10, "the 20th turn to end")
    failed = [kw for ev, kw in g.events if ev == "status.front_failed"]
    assert 1 <= len(failed) <= 2, failed  # the first at once, the count at stop
    assert failed[0]["error"] == "RuntimeError('tick')"
    assert sum(kw.get("repeated", 0) for kw in failed) + 1 >= 20


def test_a_handler_that_raises_is_logged_at_a_bounded_rate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: object) -> None:
        raise ValueError("handler")

    monkeypatch.setattr(status_server._Handler, "do_GET", broken)
    with gated() as g:
        g.gate.set()
        for _ in range(20):
            with socket.create_connection(g.server.address, timeout=REPLY) as sock:
                sock.sendall(b"GET /status HTTP/1.0\r\n\r\n")
                assert _reply(sock) == b""  # closed unanswered: the handler raised
        assert g.request("/livez")[0] == 200
        wait_for(lambda: g.server.slots.active == 0, 5, "the handlers to finish")
    failed = [kw for ev, kw in g.events if ev == "status.request_failed"]
    assert 1 <= len(failed) <= 2, failed
    assert failed[0]["error"] == "ValueError('handler')"
