"""The forwarding handler: hold at the door, forward once, stream the answer back chunk by chunk.

A request is sent to vLLM at most once. Only a connection that vLLM refused (nothing was
sent) is tried again, after waiting at the door; one that fails after it was sent (vLLM died
mid-request) is answered 502, or cut if the answer had begun, and counted: completions are
not idempotent, so the client decides whether to repeat it.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from vllmwatch.config.redact import REDACT
from vllmwatch.gate.door import Door, Readiness
from vllmwatch.gate.guard import Guard

# RFC 9110 7.6.1: meaningful for one connection only, never forwarded.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "transfer-encoding", "upgrade", "host",
                        "content-length"})
REFUSED_HOLD = 0.5  # after vLLM refused a connection, hold this long before trying again
WHOLE_BODY = 4 * 2**20  # sized answers up to this are read whole, larger ones streamed
WHOLE_BODY_TIMEOUT = 60.0  # reading such an answer once its head has come
# One forwarded exchange with vLLM, head to last byte (a long streamed generation included).
UPSTREAM_TOTAL = 3600.0


@dataclass
class GateStats:
    """Counters of the gate; written on its event loop only, read from any thread."""

    forwarded: int = 0  # requests sent to vLLM
    held: int = 0  # requests that had to wait at the door
    hold_timeouts: int = 0  # answered 503 after gate.hold_timeout
    refused_closed: int = 0  # answered 503 because vllmwatch is stopping or gave up
    failed_midrequest: int = 0  # vLLM went away after the request was sent (not retried)
    connect_retries: int = 0  # vLLM refused the connection; held again, then sent
    holding: int = 0  # waiting at the door now
    in_flight: int = 0  # forwarded and not yet answered
    # Bounds (gate/guard.py): connections shed and refused requests, by reason.
    shed_connections: int = 0  # over the connection cap: 503 and closed at once
    idle_timeouts: int = 0  # no request within the idle deadline: closed
    header_timeouts: int = 0  # a request head not complete within its deadline: closed
    body_timeouts: int = 0  # a request body not complete within its deadline: 408
    too_large: int = 0  # a request body over the cap: 413
    held_full: int = 0  # the bodies held at once would pass their cap: 503
    upstream_timeouts: int = 0  # vLLM's answer not complete within its deadline: 504
    connections: int = 0  # client connections open now
    held_bytes: int = 0  # request bodies in memory now


def _error(status: int, message: str, retry_after: float | None = None) -> web.Response:
    headers = {"Retry-After": str(math.ceil(retry_after))} if retry_after is not None else {}
    body = {"object": "error", "message": REDACT.text(message), "type": "ServiceUnavailableError"
            if status == 503 else "BadGatewayError", "param": None, "code": status}
    return web.json_response(body, status=status, headers=headers)


class Forwarder:
    """Owns the client session to vLLM and handles every request of the gate's server."""

    def __init__(self, door: Door, upstream: str, hold_timeout: float, retry_after: float,
                 stats: GateStats) -> None:
        self.door, self.upstream, self.stats = door, upstream.rstrip("/"), stats
        self.hold_timeout, self.retry_after = hold_timeout, retry_after
        self.session: aiohttp.ClientSession | None = None
        self.guard: Guard | None = None  # set by the runner once its server exists

    async def open(self) -> None:
        """Create the client session (on the gate's loop)."""
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),  # vLLM queues; we must not
            timeout=aiohttp.ClientTimeout(total=UPSTREAM_TOTAL, connect=5.0),
            auto_decompress=False)

    async def close(self) -> None:
        """Close the client session."""
        if self.session is not None:
            await self.session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Read the body within the guard's bounds, hold while vLLM is not ready, forward once."""
        guard = self.guard
        if guard is None:
            return await self._handle(request, await request.read())
        guard.begin(request.protocol)
        try:
            got = await guard.read_body(request)
            if isinstance(got, web.Response):
                return got
            try:
                return await self._handle(request, got)
            finally:
                guard.release(len(got))
        finally:
            guard.end(request.protocol)

    async def _handle(self, request: web.Request, body: bytes) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.hold_timeout
        held = False  # counted once per request, however often it waits
        while True:
            self.door.refresh()
            if not held and (self.door.state != Readiness.OPEN or self.door.waiting):
                held = True
                self.stats.held += 1
            verdict = await self._wait_at_door(deadline - loop.time())
            if verdict is not None:
                return verdict
            try:
                return await self._forward(request, body)
            except aiohttp.ClientConnectorError:
                # Refused before anything was sent: vLLM is not up (yet); safe to try again.
                self.stats.connect_retries += 1
                self.door.suspect(REFUSED_HOLD)

    async def _wait_at_door(self, timeout: float) -> web.Response | None:
        self.stats.holding += 1
        try:
            passed = await self.door.enter(max(0.0, timeout))
        finally:
            self.stats.holding -= 1
        if passed is None:
            self.stats.hold_timeouts += 1
            return _error(503, f"vLLM is not ready after {self.hold_timeout:g}s "
                          "(gate.hold_timeout); it is starting or restarting", self.retry_after)
        if not passed:
            self.stats.refused_closed += 1
            return _error(503, "vllmwatch is stopping; vLLM will not come back on this "
                          "instance", self.retry_after)
        return None

    async def _forward(self, request: web.Request, body: bytes) -> web.StreamResponse:
        assert self.session is not None
        headers = CIMultiDict((k, v) for k, v in request.headers.items()
                              if k.lower() not in HOP_BY_HOP)
        url = self.upstream + request.rel_url.raw_path_qs
        self.stats.forwarded += 1
        self.stats.in_flight += 1
        response: web.StreamResponse | None = None
        try:
            async with self.session.request(request.method, url, headers=headers,
                                            data=body or None, allow_redirects=False) as up:
                headers = CIMultiDict((k, v) for k, v in up.headers.items()
                                      if k.lower() not in HOP_BY_HOP)
                if up.content_length is not None and up.content_length <= WHOLE_BODY:
                    # A sized answer (not SSE): one read, one write; cheaper than chunks.
                    data = await asyncio.wait_for(up.read(), WHOLE_BODY_TIMEOUT)
                    return web.Response(body=data, status=up.status, reason=up.reason,
                                        headers=headers)
                response = web.StreamResponse(status=up.status, reason=up.reason,
                                              headers=headers)
                if up.content_length is not None:
                    response.content_length = up.content_length
                await response.prepare(request)
                async for chunk in up.content.iter_any():  # as it arrives: SSE stays live
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientConnectorError:
            self.stats.forwarded -= 1  # nothing was sent; the caller tries again
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.stats.failed_midrequest += 1
            if isinstance(exc, asyncio.TimeoutError):
                self.stats.upstream_timeouts += 1
            if response is not None and response.prepared:
                # The answer had begun: cut the connection so the client sees it incomplete.
                if request.transport is not None:
                    request.transport.close()
                return response
            if isinstance(exc, asyncio.TimeoutError):
                return _error(504, "vLLM's answer was not complete within its deadline; it "
                              "was not retried: send it again if it is safe to repeat")
            return _error(502, f"vLLM failed during the request ({type(exc).__name__}); it "
                          "was not retried: send it again if it is safe to repeat")
        finally:
            self.stats.in_flight -= 1
