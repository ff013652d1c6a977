"""One exchange with vLLM: send a request, pass the answer on, or say why it failed unseen.

The answer's head is held until its first body byte (vLLM sends a stream's 200 head before
any token): until then nothing has reached the client and the request may be sent again
(gate/replay.py). The send is fenced (Fence, below): the request is marked written only on
the event loop's next turn after its last write, so a stop order that waited for it comes
after its bytes are in the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from vllmwatch.config.redact import REDACT
from vllmwatch.gate import replay

# RFC 9110 7.6.1: meaningful for one connection only, never forwarded.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "transfer-encoding", "upgrade", "host",
                        "content-length"})
WHOLE_BODY = 4 * 2**20  # sized answers up to this are read whole, larger ones streamed
WHOLE_BODY_TIMEOUT = 60.0  # reading such an answer once its head has come
# Nothing of the request reached vLLM: refused, or no connection within CONNECT_TIMEOUT (vLLM's
# listen queue full, SYNs dropped). The gate waits and tries the same request again; a connect
# timeout was answered 504 "not retried" like an answer that never came.
NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
CONNECT_TIMEOUT = 5.0


_KINDS = {503: "ServiceUnavailableError", 504: "GatewayTimeoutError"}


def error_response(path: str, status: int, message: str, retry_after: float | None = None,
                   kind: str | None = None, close: bool = False) -> web.Response:
    """The gate's own error answer, in the shape of the path's API (replay.error_body); its
    message redacted. close: the connection closes after it (a refused body)."""
    headers = {"Retry-After": str(math.ceil(retry_after))} if retry_after is not None else {}
    if close:
        headers["Connection"] = "close"
    kind = kind or _KINDS.get(status, "BadGatewayError")
    return web.json_response(replay.error_body(path, status, REDACT.text(message), kind),
                             status=status, headers=headers)


@dataclass(eq=False)
class Exchange:
    """One request on its way to one engine generation; what the gate knows of it."""

    gen: int | None
    fence: Fence
    path: str = ""
    has_body: bool = False
    written: bool = False  # the fence was told the request is in the socket
    begun: bool = False  # something of the answer reached the client
    cut: bool = False  # the gate cut it: vllmwatch declared the engine stuck
    vllm_error: bool = False  # vLLM itself ended the begun stream with an error event
    broken: bool = False  # begun, then failed: ended by the gate (error event or cut)
    ended: bool = False  # the stream's last event passed: the client has the whole answer
    tail: bytes = b""  # the last bytes passed on: whether an SSE event was left unfinished
    task: asyncio.Task[Any] | None = field(default=None, repr=False)

    def mark_written(self) -> None:
        """The fence may let a stop order go on (once)."""
        if not self.written:
            self.written = True
            self.fence.sent(self.gen)


def trace_config() -> aiohttp.TraceConfig:
    """Marks an exchange written on the loop turn after its last write: the body's chunk
    (headers and body go out in one write), or the head of a request without a body."""
    tc = aiohttp.TraceConfig()

    async def chunk_sent(_s: Any, ctx: SimpleNamespace, _p: Any) -> None:
        ex = ctx.trace_request_ctx
        if isinstance(ex, Exchange) and ex.has_body:
            asyncio.get_running_loop().call_soon(ex.mark_written)

    async def headers_sent(_s: Any, ctx: SimpleNamespace, _p: Any) -> None:
        ex = ctx.trace_request_ctx
        if isinstance(ex, Exchange) and not ex.has_body:
            asyncio.get_running_loop().call_soon(ex.mark_written)

    tc.on_request_chunk_sent.append(chunk_sent)
    tc.on_request_headers_sent.append(headers_sent)
    return tc


class Failed(str):
    """Why an exchange failed with nothing sent to the client (a replayable failure):
    connection | engine_dead | shutting_down | engine_stuck."""


async def run(session: aiohttp.ClientSession, request: web.Request, url: str, body: bytes,
              ex: Exchange) -> web.StreamResponse | Failed:
    """Send, and pass the answer on; Failed when it failed before anything reached the
    client. A begun answer that fails is ended (error event or cut) and returned."""
    headers = CIMultiDict((k, v) for k, v in request.headers.items()
                          if k.lower() not in HOP_BY_HOP)
    response: web.StreamResponse | None = None
    try:
        async with session.request(request.method, url, headers=headers, data=body or None,
                                   allow_redirects=False, trace_request_ctx=ex) as up:
            ex.mark_written()  # an answer came: it was sent long ago
            headers = CIMultiDict((k, v) for k, v in up.headers.items()
                                  if k.lower() not in HOP_BY_HOP)
            if up.content_length is not None and up.content_length <= WHOLE_BODY:
                # A sized answer (not SSE): one read, one write; cheaper than chunks.
                data = await asyncio.wait_for(up.read(), WHOLE_BODY_TIMEOUT)
                gone = replay.engine_gone_answer(up.status, data)
                if gone is not None:
                    return Failed(gone)
                return web.Response(body=data, status=up.status, reason=up.reason,
                                    headers=headers)
            first = await up.content.readany()  # the head waits for it: not begun before
            if replay.engine_dead_event(first) or \
                    replay.engine_gone_answer(up.status, first) is not None:
                return Failed("engine_dead")
            response = web.StreamResponse(status=up.status, reason=up.reason, headers=headers)
            if up.content_length is not None:
                response.content_length = up.content_length
            await response.prepare(request)
            ex.begun = True
            chunk = first
            while chunk:  # as it arrives: SSE stays live
                if b'"error"' in chunk and replay.ENGINE_DEAD in chunk:
                    ex.vllm_error = True  # vLLM's own error event: the stream is ended
                if replay.END_OF_STREAM.search(chunk):
                    ex.ended = True  # vLLM may fail after it (measured): nothing is lost
                await response.write(chunk)
                ex.tail = (ex.tail + chunk)[-2:]
                chunk = await up.content.readany()
            await response.write_eof()
            return response
    except asyncio.CancelledError:
        if not ex.cut:
            raise  # the client left, or the gate stops
        return await _failed(request, response, ex, "engine_stuck")
    except NOT_SENT:
        raise  # refused or not connected in time: nothing was sent; the caller tries again
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        if isinstance(exc, asyncio.TimeoutError) and response is None:
            raise  # not a failure of the engine that vllmwatch confirmed: 504, as before
        return await _failed(request, response, ex, "connection")
    finally:
        ex.mark_written()


async def _failed(request: web.Request, response: web.StreamResponse | None, ex: Exchange,
                  why: str) -> web.StreamResponse | Failed:
    """Not begun: replayable. Begun: a stream ends with the error event its clients parse
    and its end, then the connection closes (another answer is cut: the client sees it
    incomplete)."""
    if response is None or not response.prepared:
        return Failed(why)
    if ex.ended:  # only the end of the chunked body was missing: end it, as vLLM would
        with contextlib.suppress(ConnectionError, RuntimeError, asyncio.TimeoutError):
            await asyncio.wait_for(response.write_eof(), 1.0)
        return response
    ex.broken = True
    if response.content_type == "text/event-stream":
        message = (f"vLLM failed during this answer ({why}); the answer had begun, so it "
                   "was not sent again: send the request again")
        with contextlib.suppress(ConnectionError, RuntimeError, asyncio.TimeoutError):
            # A well-formed end after the event (the client may be gone already).
            # An event cut mid-line is ended first, else the error event would be glued
            # onto it and neither would parse.
            end = b"" if not ex.tail or ex.tail == b"\n\n" else \
                b"\n" if ex.tail.endswith(b"\n") else b"\n\n"
            await asyncio.wait_for(response.write(end + replay.error_event(ex.path, message)),
                                   1.0)
            await asyncio.wait_for(response.write_eof(), 1.0)
    if request.transport is not None:
        request.transport.close()
    return response


# ---- the fence ----------------------------------------------------------------------
# The fence between the watchdog's stop orders and the gate's sends (issue 37.9).
#
# The daemon's loop tells the gate, on its own thread and BEFORE it signals a child, that the
# child's engine generation (its pid) is to stop: `order(gen)`. From then on no request is sent
# to that generation, and `order` returns only once every send that had passed the check has
# been written to its socket (bounded by FENCE_WAIT): what the old vLLM receives, it received
# before its SIGTERM. A send that still completes after that is counted (`late`), a defect by
# definition; the snapshot's readiness alone (polled, published at the end of a loop turn)
# cannot give this order, since a turn may signal the child before its new state is published.
# Thread-safe: `order` runs on the loop's thread, everything else on the gate's event loop.

FENCE_WAIT = 2.0  # the longest a stop order waits for sends under way (connect: 5 s cap)
REMEMBERED = 64  # stopped generations remembered (pids; a few per restart)


class Fence:
    """Which engine generations were told to stop, and the sends under way to each."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._stopped: deque[int] = deque(maxlen=REMEMBERED)
        self._signalled: deque[int] = deque(maxlen=REMEMBERED)  # the wait is over
        self._sending: dict[int, int] = {}
        self.late = 0  # sends written after the stop order's wait ended (must stay 0)
        self.timeouts = 0  # stop orders that did not see their sends done within FENCE_WAIT

    def stopped(self, gen: int | None) -> bool:
        """Whether `gen` was told to stop (None: unknown generation, never fenced)."""
        with self._cond:
            return gen is not None and gen in self._stopped

    def begin(self, gen: int | None) -> bool:
        """A send to `gen` is about to start: False (and nothing counted) if it may not."""
        if gen is None:
            return True
        with self._cond:
            if gen in self._stopped:
                return False
            self._sending[gen] = self._sending.get(gen, 0) + 1
            return True

    def sent(self, gen: int | None) -> None:
        """The send begun by begin(gen) is written (or failed): the stop order may go on."""
        if gen is None:
            return
        with self._cond:
            left = self._sending.get(gen, 0) - 1
            if left > 0:
                self._sending[gen] = left
            else:
                self._sending.pop(gen, None)
            if gen in self._signalled:
                self.late += 1
            self._cond.notify_all()

    def order(self, gen: int, wait: float = FENCE_WAIT) -> bool:
        """`gen` is told to stop: no new send to it; wait for the sends under way. True when
        none is left (False: timed out, counted)."""
        with self._cond:
            if gen not in self._stopped:
                self._stopped.append(gen)
            done = self._cond.wait_for(lambda: not self._sending.get(gen), wait)
            if not done:
                self.timeouts += 1
            if gen not in self._signalled:
                self._signalled.append(gen)
            return done
