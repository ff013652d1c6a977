"""Bounds of the gate against its clients: connections, idle and header deadlines, bodies.

aiohttp caps header sizes but not how many connections are open, how long one may stay idle
before its first request, how slowly a head may trickle, or how many request bodies are held
in memory while vLLM is not ready. Here:
- at most `max_connections` client connections; at the cap the longest idle one is closed for
  a new one, and with none idle the new one gets 503 and is closed (gate/shed.py; so the
  descriptors of probes, spawns and the status endpoint stay free);
- a connection with no request in progress is closed after IDLE_TIMEOUT (HEADER_TIMEOUT before
  its first byte); a request head begun must be complete within HEADER_TIMEOUT; aiohttp's page
  for a request it cannot parse never echoes its bytes;
- a body is read within BODY_TIMEOUT (else 408) and up to what vLLM takes (max_body, else
  413); all bodies held at once are at most MAX_HELD (else 503); `Expect: 100-continue` is met
  only for a body the gate will read (gate/head.py);
- a client that takes no byte of its answer for WRITE_STALL is cut (ClientGone), and a
  connection the gate closes is aborted if its last bytes are not taken (`close`); an answer
  still going out after its handler returned keeps its connection from the idle deadline and
  the cap's pick while the client takes bytes of it (none for IDLE_TIMEOUT: cut).
Every shed connection and refusal is counted (GateStats) and logged at a bounded rate; a
client that left mid-request is counted, never an error. Runs on the gate's event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from vllmwatch.config.redact import REDACT
from vllmwatch.gate import replay

_KINDS = {400: "BadRequestError", 500: "InternalServerError", 503: "ServiceUnavailableError",
          504: "GatewayTimeoutError"}
RETRY_SOON = 1  # seconds: a 5xx of the gate's own whose caller names no figure
# The gate's own answers with these say when to retry, or that a retry cannot help: every one
# is made by error_response (aiohttp's own 500 and 504 too: _Quiet), but the shed's raw 503.
RETRYABLE = frozenset({500, 502, 503, 504})


def error_response(path: str, status: int, message: str, retry_after: float | None = None,
                   kind: str | None = None, close: bool = False, final: bool = False
                   ) -> web.Response:
    """The gate's own error answer, in the shape of the path's API (replay.error_body); its
    message redacted. close: the connection closes after it (a refused body). A 5xx always
    says when to try again (a client's retry policy reads it): RETRY_SOON unless the caller
    knows better (gate.retry_after); `final`: never, the same request sent again fails again
    or does harm (NOT_AGAIN)."""
    if retry_after is None and status in RETRYABLE and not final:
        retry_after = RETRY_SOON
    headers = {"Retry-After": str(math.ceil(retry_after))} if retry_after is not None else {}
    if final:  # (the openai and anthropic packages resend a 5xx unless this says not to)
        headers = {"X-Should-Retry": "false"}
    if close:
        headers["Connection"] = "close"
    kind = kind or _KINDS.get(status, "BadGatewayError")
    response = web.json_response(replay.error_body(path, status, REDACT.text(message), kind),
                                 status=status, headers=headers)
    if close:  # the header alone kept it open: aiohttp served the next pipelined request
        response.force_close()
    return response


# Why a request is not sent again that its client's sending it again cannot cure either: a
# quarantined one is refused 422 for 10 minutes, and a KV handle (gate/kvhandle.py) read
# twice may be answered from another request's cache. Its 502 names no Retry-After.
NOT_AGAIN = ("it is quarantined", "it carries kv_transfer_params")


def not_sent(path: str, status: int, failure: str, why: str, retry_after: float
             ) -> web.Response:
    """The answer to a request vLLM failed before answering, not sent again for `why`."""
    told = f"vLLM failed before answering ({failure}); it was not sent again: {why}; "
    if why.startswith(NOT_AGAIN):
        return error_response(path, status, told + "do not send it again as it is", final=True)
    return error_response(path, status, told + "send it again if it is safe to repeat",
                          retry_after)


MAX_CONNECTIONS = 1024
IDLE_TIMEOUT = 60.0  # no request in progress (before the first one, or between them)
HEADER_TIMEOUT = 10.0  # from the first byte of a request head to its end
BODY_TIMEOUT = 60.0  # the whole request body
# A request head's fields, and the bytes of one: aiohttp's default 128 fields let each
# connection hold ~1 MiB of unfinished head for HEADER_TIMEOUT, 1 GiB at the connection cap.
MAX_HEADERS, MAX_FIELD = 64, 8190
MAX_BODY = 16 * 2**20  # one request body at least (prompts with images); aiohttp's: 1 MiB
MAX_HELD = 256 * 2**20  # all request bodies in memory at once
TOO_LARGE = "(16 MiB, or more as the audio cap VLLM_MAX_AUDIO_CLIP_FILESIZE_MB of vLLM asks)"
SWEEP_EVERY = 1.0


@dataclass
class _Conn:
    since: float  # accepted, or the end of the last request
    head_began: float | None = None  # first byte of a request head not yet handled
    busy: int = 0  # requests of this connection in our handler now
    silent: bool = True  # no byte received yet: held to HEADER_TIMEOUT, not IDLE_TIMEOUT
    unsent: int = 0  # bytes of its answers not yet taken, at the last sweep past its deadline

    def idle(self) -> bool:
        return not self.busy and self.head_began is None


class _Quiet(RequestHandler):
    """aiohttp's handler, whose own error pages were no API's error (text; HTML for a browser;
    no retry header) and quoted an unparsable request's bytes back (a client's key): the
    gate's JSON error instead, fixed text (the log's copy passes the redactor, shell/logs.py).
    A client that left is counted (`count`, clients_left), never logged as the library's."""

    __slots__ = ("count",)
    count: Callable[[str], None]

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        transport = self.transport
        if isinstance(exc, ConnectionError) and (transport is None or transport.is_closing()):
            # The client left (mid-upload, before its 100 Continue): its doing, counted, not
            # aiohttp's error-level "Error handling request" (library.message); nothing sent
            self.count("clients_left")
            gone = web.Response(status=status)
            gone.force_close()
            return gone
        super().handle_error(request, status, exc, "")  # logs it; raises if the answer began
        # A crashed handler's 500, a timed-out one's 504 say when to retry; a 4xx, that it can't
        why = "the gate " + ("did not answer in time" if status == 504 else "failed on this "
                             "request (its log says why)") + "; send it again if safe to repeat"
        return error_response(request.path, status, why if status >= 500 else f"{status}: the "
                              "gate could not parse the request", close=True, final=status < 500)


class _Tracked(asyncio.Protocol):
    """aiohttp's handler (slotted: no attribute can be patched), seen on its way in: when a
    request head begins. Every protocol call is passed on unchanged."""

    def __init__(self, handler: Any, conn: _Conn, lost: Callable[[Any], None]) -> None:
        self.handler, self.conn, self._lost = handler, conn, lost

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        conn.silent = False
        if not conn.busy and conn.head_began is None:
            conn.head_began = asyncio.get_running_loop().time()
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return bool(self.handler.eof_received())

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(self.handler)
        self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()


class Guard:
    """Tracks the gate's client connections and enforces the caps and deadlines above."""

    def __init__(self, server: web.Server, count: Callable[[str], None],
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.server, self.count, self.max_connections = server, count, max_connections
        self.conns: dict[Any, _Conn] = {}  # RequestHandler -> its clocks
        self.held = 0  # bytes of request bodies in memory now
        self.max_body = MAX_BODY  # one body's; more for the audio vLLM takes (new_engine)

    def factory(self) -> asyncio.BaseProtocol:
        """The protocol factory for the listening socket: the handler, or a shed. At the cap
        the longest idle connection makes room (a keep-alive may be closed when idle; 1024
        connections that never send a byte locked every client out until their deadline)."""
        if len(self.conns) >= self.max_connections:
            from vllmwatch.gate.shed import Shed, sending  # (only at the cap: not every run)
            # Never one whose answer still goes out to a client taking it (`sending`, the
            # sweep's own test): cut, its client got a truncated body, counted as idle
            idle = sorted(((c.since, h) for h, c in self.conns.items() if c.idle()),
                          key=lambda pair: pair[0])
            room = next((h for _, h in idle if not sending(h.transport, self.conns[h].unsent)),
                        None)
            if room is None:
                self.count("shed_connections")
                return Shed()
            self._cut(room, "idle_timeouts")
        loop = asyncio.get_running_loop()
        handler = _Quiet(self.server, loop=loop, **self.server._kwargs)
        handler.count = self.count
        conn = _Conn(loop.time())
        self.conns[handler] = conn
        return _Tracked(handler, conn, self._gone)

    def begin(self, handler: Any) -> None:
        """A request of this connection reached the handler (its head is complete)."""
        conn = self.conns.get(handler)
        if conn is not None:
            conn.busy += 1
            conn.head_began = None

    def end(self, request: web.BaseRequest) -> None:
        """That request was answered. One that asks to switch protocols (Upgrade: h2c, as
        curl --http2 sends; websocket) closes its connection after its answer: aiohttp's
        parser stops at it (llhttp's pause), so bytes pipelined behind it were dropped, never
        answered, the connection left open; the gate speaks HTTP/1.1 only (RFC 9110 7.8: it
        may ignore Upgrade), and a close tells the client what was not answered."""
        handler = request.protocol
        if "Upgrade" in request.headers:
            handler.close()  # (its answer goes out first; not at begin: its body is read)
        conn = self.conns.get(handler)
        if conn is not None:
            conn.busy -= 1  # (its answer's unsent figure is this answer's from now on)
            conn.since, conn.unsent = asyncio.get_running_loop().time(), 0

    async def sweep(self) -> None:
        """Close connections past their idle or header deadline, for as long as the gate runs."""
        while True:
            await asyncio.sleep(SWEEP_EVERY)
            self.sweep_once(asyncio.get_running_loop().time())

    def sweep_once(self, now: float) -> None:
        """One pass of the deadlines."""
        for handler, conn in list(self.conns.items()):
            if conn.busy:
                continue
            if conn.head_began is not None and now - conn.head_began > HEADER_TIMEOUT:
                self._cut(handler, "header_timeouts")
            elif conn.head_began is None and now - conn.since > (
                    HEADER_TIMEOUT if conn.silent else IDLE_TIMEOUT):
                from vllmwatch.gate.shed import sending  # (only past a deadline, at the cap)
                if unsent := sending(handler.transport, conn.unsent):  # its answer goes out
                    conn.since, conn.unsent = now, unsent
                else:
                    self._cut(handler, "idle_timeouts")

    def _cut(self, handler: Any, reason: str) -> None:
        self.count(reason)
        transport = handler.transport
        if transport is not None:
            # abort, not close: close waits for the write buffer to drain, which a client
            # that never reads its answer never lets happen (the socket and the answer's
            # bytes stayed, uncounted, past max_connections)
            transport.abort()
        self.conns.pop(handler, None)

    def _gone(self, handler: Any) -> None:
        self.conns.pop(handler, None)

    async def read_body(self, request: web.Request) -> bytes | web.Response:
        """The request body within the caps and BODY_TIMEOUT, or the error to answer (what
        its head refuses was answered before: gate/head.py); a body returned stays counted
        in `held` until release(len(body))."""
        chunks: list[bytes] = []
        got = [0]

        async def read() -> web.Response | None:
            async for chunk in request.content.iter_any():
                got[0] += len(chunk)
                self.held += len(chunk)
                chunks.append(chunk)
                refusal = self._over(request.path, got[0])
                if refusal is not None:
                    return refusal
            return None

        try:
            refusal = await asyncio.wait_for(read(), BODY_TIMEOUT)
        except asyncio.TimeoutError:
            self.count("body_timeouts")
            refusal = _refuse(request.path, 408,
                              f"request body not complete within {BODY_TIMEOUT:g}s")
        except BaseException:
            self.release(got[0])
            raise
        if refusal is not None:
            self.release(got[0])
            return refusal
        return b"".join(chunks)

    def release(self, size: int) -> None:
        """A body read by read_body is no longer held."""
        self.held -= size

    def _over(self, path: str, size: int) -> web.Response | None:
        if size > (cap := self.max_body):
            self.count("too_large")
            return _refuse(path, 413, f"a body over the gate's cap of {cap} bytes {TOO_LARGE}")
        if self.held > MAX_HELD:
            self.count("held_full")
            return _refuse(path, 503, f"the gate holds {self.held} bytes of request bodies "
                           f"(at most {MAX_HELD}: of requests held or under way); try again "
                           "shortly")
        return None


def _refuse(path: str, status: int, message: str, retry_after: int | None = None
            ) -> web.Response:
    return error_response(path, status, message, retry_after, "RequestRefused", close=True)


# ---- writes to the client -----------------------------------------------------------

# A client that took no byte of its answer for this long stopped reading: cut (its socket
# aborted, the buffered answer dropped); a slow reader takes some bytes within it.
WRITE_STALL = 60.0
STALLED = "the client took no byte of its answer for WRITE_STALL s"
_TIMEOUT = getattr(asyncio, "timeout", None)  # Python 3.11+: no task per write
CLOSE_GRACE = 5.0  # a closed connection's last bytes: then it is aborted


class ClientGone(Exception):
    """The client's connection broke while the gate wrote to it (a chat UI's stop button):
    aiohttp raises ClientConnectionResetError, an aiohttp.ClientError, which was taken for
    vLLM failing and counted against a healthy engine (cut, failed_midrequest)."""


async def to_client(write: Awaitable[object]) -> None:
    """A write to the client; its connection breaking is ClientGone, never a ClientError,
    and so is a client that takes no byte for WRITE_STALL s (it stopped reading: it held its
    connection slot for good, the idle sweep skips a connection with a request on it)."""
    try:
        if _TIMEOUT is not None:
            async with _TIMEOUT(WRITE_STALL):
                await write
        else:  # pragma: no cover  (Python 3.10: one task per write)
            await asyncio.wait_for(write, WRITE_STALL)
    except ConnectionError as exc:
        raise ClientGone from exc
    except asyncio.TimeoutError as exc:
        raise ClientGone(STALLED) from exc


def close(transport: asyncio.BaseTransport | None) -> None:
    """Close the connection after its last bytes; abort it CLOSE_GRACE s on if the client
    has not taken them."""
    if transport is not None:
        transport.close()
        asyncio.get_running_loop().call_later(CLOSE_GRACE, _abort, transport)


def _abort(transport: asyncio.BaseTransport) -> None:
    with contextlib.suppress(Exception):  # closed already: abort does nothing
        transport.abort()  # type: ignore[attr-defined]
