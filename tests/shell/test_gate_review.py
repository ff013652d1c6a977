"""The gate against a hostile review (round of issues 34/35): an idle upstream connection
vLLM is closing is never reused; a cut that lands before an exchange's first step replays it
and leaves the fence clean; an event cut mid-line is ended before the error event; a refused
request does not start the header clock; the gate's own errors on the Anthropic API are in
Anthropic's shape. A scripted upstream plays vLLM (tests/shell/test_gate_replay.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.shell.test_gate_replay import (
    BODY,
    OK,
    in_thread,
    post,
    relaunch_when_tried,
    settle,
    setup,
)
from tests.support import TIMEOUT_SCALE, free_port, wait_until
from tests.support.rawhttp import read_request
from vllmwatch.gate import proxy
from vllmwatch.gate.door import Readiness
from vllmwatch.gate.runner import Gate

UVICORN_KEEPALIVE = 5.0  # vLLM's uvicorn closes a connection idle this long


# ---- keep-alive ----------------------------------------------------------------------

class ClosingUpstream:
    """Closes a kept-alive connection when the next request arrives on it after it idled
    over `idle` s, before answering: uvicorn's timeout_keep_alive meeting a reuse."""

    def __init__(self, idle: float) -> None:
        self.idle, self.closed = idle, 0
        self.port = free_port()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        last: float | None = None
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n")
                               if x.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                now = time.monotonic()
                if last is not None and now - last > self.idle:
                    self.closed += 1
                    return  # closed: the request met a disconnect
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(OK), OK))
                await writer.drain()
                last = time.monotonic()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self._ready.set()
        async with server:
            await self._stop.wait()

    def __enter__(self) -> ClosingUpstream:
        self._thread.start()
        assert self._ready.wait(10 * TIMEOUT_SCALE)
        return self

    def __exit__(self, *_a: object) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10 * TIMEOUT_SCALE)


def test_the_gate_drops_idle_upstream_connections_before_vllm_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An upstream connection idle past vLLM's keep-alive was reused: the request met a
    disconnect, the healthy engine was taken for a failed one, and its client got 503 after
    gate.hold_timeout. The gate drops idle connections first (KEEPALIVE, scaled down here
    with the upstream's idle limit: the same order as 2 s before uvicorn's 5 s)."""
    assert proxy.KEEPALIVE < UVICORN_KEEPALIVE
    monkeypatch.setattr(proxy, "KEEPALIVE", 0.2)
    with ClosingUpstream(idle=0.5) as up:
        g = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{up.port}",
                 lambda: Readiness.OPEN, 5.0, retry_after=1, generation=lambda: 1)
        g.start()
        try:
            assert post(g.port) == (200, OK)
            time.sleep(0.8)  # idle past both limits: what is measured is the order
            assert post(g.port) == (200, OK)
            assert up.closed == 0, "the gate reused a connection vLLM closes"
            assert (g.stats.failed_midrequest, g.stats.replayed) == (0, 0)
        finally:
            g.stop()


# ---- a cut before the exchange's first step ------------------------------------------

def test_a_cut_landing_before_the_exchange_starts_replays_it_and_frees_the_fence() -> None:
    """The hang verdict's cut reaches the gate's loop in the turn between the fence's check
    and the exchange's first step (the task is cancelled before it runs): the client was
    dropped without an answer and the fence kept the send counted, so the stop order waited
    its whole FENCE_WAIT. Now it is an unanswered request like any other: replayed."""
    with setup((200, OK)) as (g, script, d):  # the stuck engine is never sent anything
        fence = g.forwarder.fence
        begin, fired = fence.begin, []

        def begin_then_cut(gen: int | None) -> bool:
            ok = begin(gen)
            if ok and not fired and gen is not None:
                fired.append(gen)  # the verdict's callback, queued just before the exchange
                asyncio.get_running_loop().call_soon(g._stopped, gen, True, True)
            return ok

        fence.begin = begin_then_cut  # type: ignore[method-assign]
        out, t = in_thread(lambda: post(g.port))
        relaunch_when_tried(g, script, d)
        t.join(30 * TIMEOUT_SCALE)
        settle(g)
        assert out == [(200, OK)]
        assert [gen for _, gen in script.seen] == [2], "never sent to the stuck engine"
        assert fence.order(1, wait=0.0), "a send counted for ever in the fence"
        assert (g.stats.replayed, g.stats.replay_answered) == (1, 1)


# ---- an SSE event cut mid-line --------------------------------------------------------

def _events(body: bytes) -> list[bytes]:
    return [e for e in body.split(b"\n\n") if e.strip()]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
@pytest.mark.parametrize("sent", [
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"hel',  # mid-line
    b'data: {"id":"c1","choices":[]}\n',  # the line, not the event's blank line
    b'data: {"id":"c1","choices":[]}\n\n',  # a whole event
], ids=["mid-line", "mid-event", "whole"])
def test_the_error_event_starts_an_event_of_its_own(path: str, sent: bytes) -> None:
    """The stream had begun (its first event passed: the gate reads a first event whole
    before it begins, test_gate_split_events.py), then vLLM failed with `sent` half-written."""
    # (a token: an event with none does not begin a completion stream, gate/aborted.py)
    first = b'data: {"id":"c0","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    with setup(("stream", [first, sent], "reset")) as (g, _script, _d):
        status, body = post(g.port, path, {**BODY, "stream": True})
        settle(g)
    assert status == 200 and body.startswith(first + sent.rstrip(b"\n")), body
    last = _events(body)[-1]
    lines = last.split(b"\n")
    if path == "/v1/messages":
        assert lines[0] == b"event: error", body
        data = json.loads(lines[1].removeprefix(b"data: "))
        assert data["type"] == "error" and data["error"]["type"] == "api_error"
    else:
        assert len(lines) == 1, body
        assert "error" in json.loads(lines[0].removeprefix(b"data: "))
    assert g.stats.cut_midstream == 1


# ---- a refused request and the header clock -------------------------------------------

@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate(f"127.0.0.1:{free_port()}", "http://127.0.0.1:9", lambda: Readiness.HOLD, 0.5,
             retry_after=1, generation=lambda: 1)
    g.start()
    try:
        yield g
    finally:
        g.stop()


def _raw(port: int, data: bytes) -> tuple[socket.socket, bytes]:
    s = socket.create_connection(("127.0.0.1", port), timeout=30 * TIMEOUT_SCALE)
    s.sendall(data)
    got = b""
    while b"\r\n\r\n" not in got:
        got += s.recv(65536)
    head, _, rest = got.partition(b"\r\n\r\n")
    length = next(int(x.split(b":")[1]) for x in head.split(b"\r\n")
                  if x.lower().startswith(b"content-length:"))
    while len(rest) < length:
        rest += s.recv(65536)
    return s, head + b"\r\n\r\n" + rest


@pytest.mark.parametrize("request_line", [b"GET /docs HTTP/1.1", b"POST /sleep HTTP/1.1"])
def test_a_refused_request_leaves_no_header_clock_running(gate: Gate, request_line: bytes
                                                          ) -> None:
    """A 404 for a path off the allow-list left the head's start time set: a keep-alive
    client that then idled was cut at HEADER_TIMEOUT, counted as a slow head."""
    s, answer = _raw(gate.port, request_line + b"\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    try:
        assert answer.startswith(b"HTTP/1.1 404")
        assert gate.guard is not None
        wait_until(lambda: gate.guard is not None and all(
            c.head_began is None and not c.busy for c in gate.guard.conns.values()),
            10 * TIMEOUT_SCALE, "the request's end")
        assert [c.head_began for c in gate.guard.conns.values()] == [None]
    finally:
        s.close()


# ---- the Anthropic API's error shape --------------------------------------------------

def _json(answer: bytes) -> Any:
    return json.loads(answer.partition(b"\r\n\r\n")[2])


@pytest.mark.parametrize("case", ["404", "503-hold", "413"])
@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_the_gates_own_errors_are_in_the_shape_of_the_api_asked(gate: Gate, case: str,
                                                                api: str) -> None:
    base = "/v1/messages" if api == "anthropic" else "/v1/chat/completions"
    path, extra, length = {"404": (base + "/nowhere", b"", 2),
                           "503-hold": (base, b"", 2),
                           "413": (base, b"", 17 * 2**20)}[case]
    head = (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (path.encode(), length))
    s, answer = _raw(gate.port, head + (b"{}" if length == 2 else extra))
    s.close()
    status = int(answer.split(b" ")[1])
    assert status == {"404": 404, "503-hold": 503, "413": 413}[case]
    body = _json(answer)
    if api == "anthropic":
        want = {404: "not_found_error", 503: "overloaded_error", 413: "request_too_large"}
        assert body["type"] == "error" and body["error"]["type"] == want[status], body
        assert body["error"]["message"]
    else:
        assert body["object"] == "error" and body["code"] == status and body["message"]


def test_a_replay_refused_on_the_messages_api_is_an_anthropic_error() -> None:
    with setup("reset") as (g, _script, _d):
        g.forwarder.replay = False
        status, body = post(g.port, "/v1/messages")
        settle(g)
    got = json.loads(body)
    assert status == 502 and got["type"] == "error" and got["error"]["type"] == "api_error"
    assert "gate.replay is off" in got["error"]["message"]


# ---- pipelined requests behind a held one ---------------------------------------------

def test_pipelined_requests_behind_a_held_one_are_not_read_without_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One connection's first request waits at the door (vLLM restarting) while its client
    pipelines thousands more behind it. aiohttp before 3.14.5 parsed and queued every one
    (memory without bound, one client's choice); now (the floor in pyproject.toml) it stops
    reading that connection after 32 queued: the client's own send blocks instead."""
    from vllmwatch.gate import guard as guard_mod
    consumed = [0]
    passed_on = guard_mod._Tracked.data_received

    def counted(self: Any, data: bytes) -> None:
        consumed[0] += len(data)
        passed_on(self, data)

    monkeypatch.setattr(guard_mod._Tracked, "data_received", counted)
    g = Gate(f"127.0.0.1:{free_port()}", "http://127.0.0.1:9", lambda: Readiness.HOLD,
             600.0, retry_after=1, generation=lambda: 1)
    g.start()
    one = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: 1024\r\n\r\n" + b" " * 1022 + b"{}")
    burst = one * 8192  # 9 MiB: far past the bound, within the kernel's buffers (sent whole)
    s = socket.create_connection(("127.0.0.1", g.port), timeout=60 * TIMEOUT_SCALE)
    try:
        s.sendall(one)
        wait_until(lambda: g.stats.holding == 1, 10 * TIMEOUT_SCALE, "the first to be held")
        s.setblocking(False)
        assert g.guard is not None
        transports = [h.transport for h in g.guard.conns]

        def paused() -> bool:
            return all(t is not None and not t.is_reading() for t in transports)

        sent = 0
        deadline = time.monotonic() + 60 * TIMEOUT_SCALE
        while sent < len(burst) and time.monotonic() < deadline:
            try:
                sent += s.send(burst[sent:sent + 2**16])
            except BlockingIOError:  # the client's send blocks: what the bound is for
                if paused():
                    break
                time.sleep(0.01)  # the client retries its send; bounded by the deadline
        wait_until(paused, 30 * TIMEOUT_SCALE,
                   "the gate to stop reading the pipelining connection")
        assert consumed[0] < 2 * 2**20, f"the gate read {consumed[0]} bytes of {sent}"
        assert g.stats.holding == 1
    finally:
        s.close()
        g.stop()


# ---- a connection vLLM never accepted -------------------------------------------------

def test_a_connect_timeout_is_tried_again_not_answered_504(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's listen queue is full (SYNs dropped): the connect timed out and the gate answered
    504 "not retried", as for an answer that never came; but nothing was sent, so it waits
    and tries again, as for a refused connection."""
    from vllmwatch.gate import exchange
    monkeypatch.setattr(exchange, "CONNECT_TIMEOUT", 0.3)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)  # one connection fits in the accept queue; later SYNs are dropped
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        f = socket.socket()
        f.setblocking(False)
        f.connect_ex(("127.0.0.1", port))
        fillers.append(f)
    serving = threading.Event()

    def serve_one(c: socket.socket) -> None:
        with c:
            if read_request(c) is None:
                return
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                      b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(OK), OK))

    def serve() -> None:
        serving.wait()
        listener.settimeout(60 * TIMEOUT_SCALE)
        with contextlib.suppress(OSError):
            while True:
                c, _ = listener.accept()
                threading.Thread(target=serve_one, args=(c,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    g = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{port}", lambda: Readiness.OPEN,
             60.0, retry_after=1, generation=lambda: 1)
    g.start()
    try:
        out, t = in_thread(lambda: post(g.port))
        wait_until(lambda: g.stats.connect_retries >= 1, 30 * TIMEOUT_SCALE,
                   "a connect to time out")
        serving.set()  # the queue drains: vLLM accepts again
        t.join(60 * TIMEOUT_SCALE)
        assert out == [(200, OK)]
        assert (g.stats.upstream_timeouts, g.stats.failed_midrequest) == (0, 0)
    finally:
        g.stop()
        listener.close()
        for f in fillers:
            f.close()
