"""One exchange with vLLM: send a request, pass the answer on, or say why it failed unseen.

The answer's head is held until its first body byte (vLLM sends a stream's 200 head before
any token): until then nothing has reached the client and the request may be sent again
(gate/replay.py). The send is fenced (gate/door.py Fence): the request is marked written only
on the event loop's next turn after its last write, so a stop order that waited for it comes
after its bytes are in the socket. Upstreams (below) owns the sessions to vLLM, whose idle
connections it drops before vLLM does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, MultiMapping
from yarl import URL

from vllmwatch.config.command import KeyFileError, read_env_file
from vllmwatch.config.schema import Config
from vllmwatch.gate import guard, replay
from vllmwatch.gate.door import Fence
from vllmwatch.gate.guard import STALLED, ClientGone, error_response
from vllmwatch.gate.guard import to_client as _to_client

# What aiohttp's client adds to a request that lacks it: vLLM gets what the client sent, so
# its access log and its answers are the ones the client would get without the gate (a
# User-Agent naming aiohttp; Accept-Encoding: gzip, deflate asking a vLLM behind compression
# for what the client never asked, passed through undecoded; an octet-stream Content-Type).
NOT_ADDED = ("User-Agent", "Accept-Encoding", "Accept", "Content-Type")
# RFC 9110 7.6.1: for one connection only, never forwarded; also Proxy-Connection (the old
# name) and Expect (gate/head.py told the client 100 Continue and read the body; sent on,
# aiohttp's client would wait for vLLM's 100, for good where a hop does not answer it).
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "transfer-encoding", "upgrade", "host",
                        "content-length", "proxy-connection", "expect"})
WHOLE_BODY = 4 * 2**20  # sized answers up to this are read whole, larger ones streamed
FIRST_EVENT = 64 * 2**10  # a stream's first event is read whole, up to this, before it begins
TAIL = 256  # bytes of a stream kept from one read to the next: its markers may span two
WHOLE_BODY_TIMEOUT = 60.0  # reading such an answer once its head has come
# Every stream has a last event (replay.END_OF_STREAM, for each streaming API): one ended
# without it or an error event of vLLM's own (SAID) is unfinished: vLLM's failure.
SAID = re.compile(rb'(?:^|\n)(?:data: \{"error"|event: error\n)')
# Nothing of the request reached vLLM: refused, or no connection within CONNECT_TIMEOUT (vLLM's
# listen queue full, SYNs dropped): the gate waits and tries the same request again.
NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
CONNECT_TIMEOUT = 5.0


def end_to_end(headers: MultiMapping[str]) -> CIMultiDict[str]:
    """The headers without the hop-by-hop ones: the fixed set, and every header the
    Connection header names (RFC 9110 7.6.1), in either direction."""
    named = {t.strip().lower() for v in headers.getall("Connection", ()) for t in v.split(",")}
    return CIMultiDict((k, v) for k, v in headers.items()
                       if k.lower() not in HOP_BY_HOP and k.lower() not in named)


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
    said: bool = False  # an error event of vLLM's own (any) passed: the client was told
    broken: bool = False  # begun, then failed: ended by the gate (error event or cut)
    ended: bool = False  # its last event's marker passed (whole once replay.whole says so)
    tail: bytes = b""  # the last TAIL bytes passed on: an SSE event left unfinished, a marker
    task: asyncio.Task[Any] | None = field(default=None, repr=False)

    def mark_written(self, reached: bool = True) -> None:
        """The fence may let a stop order go on (once); `reached` False: nothing of it
        reached vLLM (not connected), never counted as sent after a stop order."""
        if not self.written:
            self.written = True
            self.fence.sent(self.gen, reached)


def trace_config() -> aiohttp.TraceConfig:
    """Marks an exchange written on the loop turn after its last write: the body's chunk
    (headers and body go out in one write), or the head of a request without a body."""
    tc = aiohttp.TraceConfig()

    def last_write(body: bool) -> Any:  # the body's chunk (body), else the head's
        async def sent(_s: Any, ctx: SimpleNamespace, _p: Any) -> None:
            ex = ctx.trace_request_ctx
            if isinstance(ex, Exchange) and ex.has_body == body:
                asyncio.get_running_loop().call_soon(ex.mark_written)
        return sent

    tc.on_request_chunk_sent.append(last_write(True))
    tc.on_request_headers_sent.append(last_write(False))
    return tc


class Failed(str):
    """Why an exchange failed with nothing sent to the client (replayable): connection |
    engine_dead | aborted | engine_stuck; `answer`: vLLM's own, passed on if not replayed."""

    answer: web.Response | None = None


async def run(session: aiohttp.ClientSession, request: web.Request, url: str, body: bytes,
              ex: Exchange) -> web.StreamResponse | Failed:
    """Send, and pass the answer on; Failed when it failed before anything reached the client.
    A begun answer that fails or ends unfinished is ended (error event, or cut) and returned."""
    headers = end_to_end(request.headers)
    # vLLM's uvicorn believes X-Forwarded-* from 127.0.0.1, the gate's address: a client's
    # own would name any address in vLLM's log; the gate says who it forwards for instead
    headers["X-Forwarded-For"], headers["X-Forwarded-Proto"] = request.remote or "", "http"
    response: web.StreamResponse | None = None
    try:
        # The target as checked, byte for byte (a str would be re-quoted: %2F, %zz).
        async with session.request(request.method, URL(url, encoded=True), headers=headers,
                                   data=body or None, allow_redirects=False,
                                   trace_request_ctx=ex) as up:
            ex.mark_written()  # an answer came: it was sent long ago
            headers = end_to_end(up.headers)
            if request.method == "HEAD":  # vLLM's length, with no body (a Response of b""
                response = web.StreamResponse(status=up.status, reason=up.reason,
                                              headers=headers)  # would drop it)
                if up.content_length is not None:
                    response.content_length = up.content_length
                await _to_client(response.prepare(request))
                await _to_client(response.write_eof())
                return response
            if up.content_length is not None and up.content_length <= WHOLE_BODY:
                # A sized answer (not SSE): one read, one write; cheaper than chunks.
                data = await asyncio.wait_for(up.read(), WHOLE_BODY_TIMEOUT)
                gone = replay.engine_gone_answer(up.status, data)
                if gone is not None:
                    return Failed(gone)
                stopped = ex.fence.stopped(ex.gen)  # (a pooling answer of vLLM told to stop)
                if (request.path in replay.READ or stopped) and _ab().answer(
                        request.path, up.status, data, stopped):
                    return cast(Failed, _ab().failed(Failed, up, data, headers))
                return web.Response(body=data, status=up.status, reason=up.reason,
                                    headers=headers)
            first = await up.content.readany()  # the head waits for it: not begun before
            while (0 < len(first) < FIRST_EVENT and b"\n\n" not in first  # the whole first
                   and up.content_type == "text/event-stream"  # event: a marker may span
                   and (more := await up.content.readany())):  # two reads of the socket
                first += more
            if not first and up.content_type == "text/event-stream":  # its head, then its
                return Failed("connection")  # end, no event: a dying engine, never an answer
            if replay.engine_dead_event(first) or \
                    replay.engine_gone_answer(up.status, first) is not None:
                return Failed("engine_dead")
            if request.path in replay.READ:  # aborted before its first token?
                first, said = await _ab().hold(up, request.path, first, FIRST_EVENT)
                if said != "begun":  # its engine stopped or died first (gate/aborted.py)
                    return cast(Failed, _ab().failed(Failed, up, first, headers, said))
            response = web.StreamResponse(status=up.status, reason=up.reason, headers=headers)
            if up.content_length is not None:
                response.content_length = up.content_length
            await _to_client(response.prepare(request))
            ex.begun = True
            chunk = first
            while chunk:  # as it arrives: SSE stays live
                seen = ex.tail + chunk  # a marker may span two reads of the socket
                if replay.DEAD_EVENT.search(seen):
                    ex.vllm_error = True  # vLLM's own error event: the stream is ended
                ex.said = ex.said or SAID.search(seen) is not None
                if replay.END_OF_STREAM.search(seen):
                    ex.ended = True  # vLLM may fail after it (measured): nothing is lost
                await _to_client(response.write(chunk))
                ex.tail = seen[-TAIL:]
                chunk = await up.content.readany()
            if not (replay.whole(ex.ended, ex.tail) or ex.said) and \
                    up.content_type == "text/event-stream":
                # a clean end, but unfinished (whatever the path: no stream is left out)
                return await _failed(request, response, ex, "its engine stopped mid-answer")
            await _to_client(response.write_eof())
            return response
    except ClientGone as gone:
        assert response is not None  # raised by a write to it
        if str(gone) == STALLED and request.transport is not None:
            request.transport.abort()  # what it never read is dropped, the socket with it
        return response  # never the engine's failure: nothing counted, nothing replayed
    except asyncio.CancelledError:
        if not ex.cut:
            raise  # the client left, or the gate stops
        return await _failed(request, response, ex, "engine_stuck")
    except NOT_SENT:
        ex.mark_written(reached=False)  # (a connect that failed after a stop order's wait)
        raise  # refused or not connected in time: nothing was sent; the caller tries again
    except aiohttp.ClientResponseError as exc:
        if response is not None:
            return await _failed(request, response, ex, "connection")
        # vLLM answered, but its head cannot be read (a header over aiohttp's 8190 bytes):
        # its answer, not its engine's death; neither replayed nor counted against it
        return error_response(request.path, 502, f"vLLM's answer could not be read: {exc.message}"
                              "; not sent again: the same request gets the same", final=True)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        if isinstance(exc, asyncio.TimeoutError) and response is None:
            raise  # not a failure of the engine that vllmwatch confirmed: 504, as before
        why = f"no byte from vLLM for {UPSTREAM_IDLE:g} s" \
            if isinstance(exc, asyncio.TimeoutError) else "connection"
        return await _failed(request, response, ex, why)
    finally:
        ex.mark_written()


def _ab() -> Any:  # gate/aborted.py, at the first completion's answer: not at start (the
    from vllmwatch.gate import aborted  # import count of `vllmwatch run`)
    return aborted


async def _failed(request: web.Request, response: web.StreamResponse | None, ex: Exchange,
                  why: str) -> web.StreamResponse | Failed:
    """Not begun: replayable. Begun: a stream ends with the error event its clients parse
    and its end, then the connection closes (another answer is cut: the client sees it
    incomplete)."""
    if response is None or not response.prepared:
        return Failed(why)
    if replay.whole(ex.ended, ex.tail):  # only the chunked body's end was missing: end it
        with contextlib.suppress(ConnectionError, RuntimeError, asyncio.TimeoutError):
            await asyncio.wait_for(response.write_eof(), 1.0)
        return response
    ex.broken = True
    if response.content_type == "text/event-stream":
        message = (f"vLLM failed during this answer ({why}): this answer is incomplete, and "
                   "it had begun, so it was not sent again: send the request again")
        with contextlib.suppress(ConnectionError, RuntimeError, asyncio.TimeoutError):
            # A well-formed end (the client may be gone already); no event after vLLM's own.
            # An event cut mid-line is ended first, or the error event glued onto it is lost.
            end = b"" if not ex.tail or ex.tail.endswith(b"\n\n") else \
                b"\n" if ex.tail.endswith(b"\n") else b"\n\n"
            if not ex.said:
                await asyncio.wait_for(response.write(end + _ab().error_event(
                    ex.path, message, ex.tail)), 1.0)
            await asyncio.wait_for(response.write_eof(), 1.0)
    guard.close(request.transport)  # its last bytes go out; unread, it is aborted
    return response


# ---- keep-alive: the sessions to vLLM, whose idle connections the gate drops first ---------
# vLLM's uvicorn closes a connection idle `VLLM_HTTP_TIMEOUT_KEEP_ALIVE` seconds (its own
# `envs.py`: `int(os.getenv(..., "5"))`, vLLM 0.26 and 0.32). A request the gate writes on a
# connection uvicorn is closing meets a disconnect before any answer: the gate cannot tell that
# from the engine's death, so a healthy engine's client was held for a replay that never came
# and got 503. The gate therefore drops its idle connections first, at 0.4 x vLLM's figure and
# at most KEEPALIVE; a figure of 0 or one vLLM cannot parse means no reuse at all.

VLLM_VAR = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
VLLM_DEFAULT = 5  # seconds, when the variable is not set (vLLM's default)
KEEPALIVE = 2.0  # the gate's ceiling: 2 s before uvicorn's default 5 s
SHARE = 0.4  # of vLLM's figure: the gate's clock starts after uvicorn's (the answer read)
# vLLM silent this long within one exchange (its head, or between two reads of its body): an
# idle bound, never one on the whole exchange, so a healthy stream may run for hours (a long
# reasoning answer on a slow box); a hung engine is the watchdog's, which restarts it sooner.
UPSTREAM_IDLE = 3600.0


def upstream_keepalive(env: Mapping[str, str], ceiling: float = KEEPALIVE) -> float:
    """Seconds an idle upstream connection is kept for reuse; 0 = never reused."""
    raw = env.get(VLLM_VAR)
    try:
        seconds = VLLM_DEFAULT if raw is None else int(raw.strip())
    except ValueError:  # vLLM itself will not start with it; never reuse meanwhile
        return 0.0
    return max(0.0, min(ceiling, SHARE * seconds))


def child_env(config: Config, base_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables vLLM is started with that decide its keep-alive, in the order
    config/command.build applies them: the daemon's environment, [vllm.env], vllm.env_file."""
    env = dict(os.environ if base_env is None else base_env)
    env.update(config.vllm.env)
    with contextlib.suppress(KeyFileError):  # the launch reports it, with what to do
        env.update(read_env_file(config)[0])
    return env


def keepalive_of(config: Config, ceiling: float = KEEPALIVE) -> float:
    """The gate's upstream keep-alive for vLLM as `config` starts it."""
    return upstream_keepalive(child_env(config), ceiling)


class Upstreams:
    """The client sessions to vLLM's port and to the spare's Unix socket (issue 34), made on
    the gate's loop with one keep-alive. A reload only ever shortens it (the engine that runs
    until the restart may still have the old, shorter figure): new sessions are made and the
    old ones stay open for the exchanges under way, closed at close(). The figure is vLLM's
    whole seconds x SHARE under KEEPALIVE, so it can shorten at most five times: the retired
    sessions are bounded by construction."""

    def __init__(self) -> None:
        self.keepalive = upstream_keepalive({})  # start_gate sets vLLM's own
        self.spare_socket: str | None = None
        self.main: aiohttp.ClientSession | None = None
        self.spare: aiohttp.ClientSession | None = None
        self.retired: list[aiohttp.ClientSession] = []

    def open(self) -> None:
        """Make the sessions (on the gate's loop: aiohttp binds them to it)."""
        reuse: dict[str, object] = ({"keepalive_timeout": self.keepalive}
                                    if self.keepalive > 0 else {"force_close": True})
        timeout = aiohttp.ClientTimeout(total=None, sock_read=UPSTREAM_IDLE,
                                        connect=CONNECT_TIMEOUT)
        self.main = _no_resend(aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, **reuse),  # type: ignore[arg-type]
            timeout=timeout, auto_decompress=False,  # limit 0: vLLM queues, not the gate
            skip_auto_headers=NOT_ADDED, trace_configs=[trace_config()]))
        if self.spare_socket is not None:
            self.spare = _no_resend(aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self.spare_socket, limit=0,
                                                **reuse),  # type: ignore[arg-type]
                timeout=timeout, auto_decompress=False, skip_auto_headers=NOT_ADDED,
                trace_configs=[trace_config()]))

    def narrow(self, seconds: float) -> None:
        """A reload's keep-alive (on the gate's loop, or with the gate not serving): taken
        only when shorter."""
        if seconds >= self.keepalive:
            return
        self.keepalive = seconds
        if self.main is None or self.main.closed:
            return  # not serving: open() takes it
        self.retired += [s for s in (self.main, self.spare) if s is not None]
        self.open()

    async def close(self) -> None:
        """Close every session."""
        for session in (self.main, self.spare, *self.retired):
            if session is not None:
                await session.close()


def _no_resend(session: aiohttp.ClientSession) -> aiohttp.ClientSession:
    """aiohttp sends an idempotent method (GET, DELETE, PUT, ...) once more on a new
    connection when the first closed unanswered, even where vLLM had read it: past the
    gate's replay rules, its fence and its counters (a DELETE ran twice; a GET reached an
    engine told to stop). 3.14 has no public switch: this is the attribute its retry reads
    (tests/shell/test_gate_no_resend.py fails if a new aiohttp moves it)."""
    session._retry_connection = False
    return session
