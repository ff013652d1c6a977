"""What the gate answers from a request's head alone: before its `100 Continue`, before a
byte of its body is read.

Every refusal the head decides comes first, the same on every path of a request (vLLM
serving, starting, restarting: held at the door): a path off the list (404), a transfer
coding or a Content-Length over the cap or an expectation other than 100-continue (501, 413,
417), vllmwatch stopping (503), no or a wrong API key as far as the key of the engine it
would go to is known now (401, gate/apikey.py). Only a request none of them refuses is told
`100 Continue` (when it asks) and has its body read. Before, the key was checked after the
body: a wrong-key upload (curl sends Expect for bodies over 1 MiB: audio) was told to go on,
read whole, held, and then refused. A refusal whose body was not read closes its connection:
a client told no 100 may send its next request instead of the body, which would have been
taken as that body (aiohttp's lingering read) and the bytes after it as a request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from vllmwatch.config.redact import REDACT
from vllmwatch.gate import replay
from vllmwatch.gate.door import STOPPING, UNAUTHORIZED, Door, GateStats, Readiness
from vllmwatch.gate.guard import MAX_BODY, TOO_LARGE, Guard, error_response

if TYPE_CHECKING:  # (loaded by a gate that has a key: gate/proxy.py)
    from vllmwatch.gate.apikey import HeldKey


class Forwarder(Protocol):
    """What of gate/proxy.Forwarder the head's refusals read (proxy imports this module)."""

    door: Door
    guard: Guard | None
    key: HeldKey | None
    stats: GateStats
    retry_after: float

    def count(self, reason: str) -> None: ...


async def admit(request: web.Request, fwd: Forwarder) -> web.Response | None:
    """None: the gate reads the body now (told `100 Continue` first when it asked); else the
    refusal to answer, the body unread (its connection closed after it when a body is to
    come)."""
    answer = refusal(request, fwd)
    if answer is None:
        if request.version >= (1, 1) and \
                request.headers.get("Expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # (as aiohttp's: the answer's size starts after it)
        return None
    if request.body_exists and not request.content.is_eof():
        answer.force_close()  # (Connection: close; aiohttp discards what still comes, bounded)
    return answer


def refusal(request: web.Request, fwd: Forwarder) -> web.Response | None:
    """The gate's answer to this head when it refuses the request whatever its body; counted.
    None: its body is read and the request goes on (the key may still be refused later, once
    the engine it waits for is launched: HeldKey.enter)."""
    method, path = request.method, request.path
    why = replay.refusal(method, path, request.raw_path)
    if why is not None:  # 404 from the gate itself, counted (logged at a bounded rate)
        fwd.count("path_refused")
        return error_response(path, 404, why, kind="NotFoundError")
    guard = fwd.guard
    refused = body_refusal(request, guard.max_body if guard is not None else MAX_BODY)
    if refused is not None:
        if refused[0]:
            fwd.count(refused[0])
        return refused[1]
    door = fwd.door
    door.refresh()
    if door.state == Readiness.CLOSED:  # (as the door would say once the body was read)
        fwd.stats.refused_closed += 1
        return error_response(path, 503, STOPPING, fwd.retry_after)
    key = fwd.key
    if key is not None and key.refuses_now(door, method, path,
                                           request.headers.get("Authorization")):
        fwd.count("unauthorized")  # (counted, logged at a bounded rate: gate.refused)
        return web.json_response(UNAUTHORIZED, status=401)  # vLLM's own 401
    return None


def body_refusal(request: web.Request, cap: int) -> tuple[str, web.Response] | None:
    """What the head alone says of the body: (the counter, the refusal) when the gate will
    not read it ("" counts none; over `cap` bytes: 413); None when it will."""
    coding = request.headers.get("Transfer-Encoding", "")
    if coding and coding.replace(" ", "").lower() != "chunked":  # gzip, chunked: vLLM
        return "bad_encoding", _refuse(  # would get the compressed bytes as if plain
            request.path, 501, f"Transfer-Encoding {REDACT.head(coding, 40)!r} is not "
            "supported; send the body plain or chunked")
    length = request.content_length
    if length is not None and length > cap:
        return "too_large", _refuse(request.path, 413, f"request body of {length} bytes is "
                                    f"over the gate's cap of {cap} bytes {TOO_LARGE}")
    expect = request.headers.get("Expect", "100-continue").lower()
    if expect != "100-continue" and request.version >= (1, 1):  # never quoted (aiohttp's
        return "", _refuse(request.path, 417, "the only expectation the gate meets is "
                           "Expect: 100-continue")  # 417 echoed it, as text)
    return None


def _refuse(path: str, status: int, message: str) -> web.Response:
    return error_response(path, status, message, None, "RequestRefused", close=True)
