"""Every 5xx the gate makes itself tells its client when to retry: Retry-After
where the same request sent again can succeed (vLLM not ready, stopping, a failure before
any answer, a timeout), X-Should-Retry: false where it cannot (quarantined, a KV handle, an
answer of vLLM's whose head cannot be read: the same request gets the same head). One rule,
in guard.error_response; aiohttp's own 500 (a handler that raised) and 504 (one that timed
out) and the shed's raw 503 follow it too, and no error page of aiohttp's reaches a client.
The openai and anthropic packages resend any 5xx unless told not to."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.shell.test_gate_replay import BODY, settle, setup
from tests.shell.test_gate_review6 import _ask
from tests.shell.test_gate_split_events import _gate
from tests.support import TIMEOUT_SCALE
from vllmwatch.gate import exchange, guard, head, shed
from vllmwatch.gate.door import Readiness

Answer = tuple[int, dict[str, str], bytes]


def _scripted(*answers: Any, path: str = "/v1/completions", body: dict[str, Any] | None = None,
              hold: float = 20.0, state: Readiness = Readiness.OPEN) -> Callable[[], Answer]:
    def ask() -> Answer:
        with setup(*answers, hold=hold) as (g, _script, d):
            d.state = state
            got = _ask(g.port, path, body)
            settle(g)
            return got
    return ask


def _raw(wire: bytes) -> Callable[[], Answer]:
    def ask() -> Answer:
        with _gate([lambda c: c.sendall(wire)]) as (port, _seen, _g):
            return _ask(port)
    return ask


def _handler_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    async def late(*_a: Any) -> None:
        raise asyncio.TimeoutError  # (aiohttp answers a handler's timeout 504 itself)
    monkeypatch.setattr(head, "admit", late)


def _handler_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    async def crash(*_a: Any) -> None:
        raise RuntimeError("a bug of the gate's")  # (aiohttp answers it 500 itself)
    monkeypatch.setattr(head, "admit", crash)


BIG_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Big: " + b"x" * 9000
            + b"\r\nContent-Length: 2\r\n\r\n{}")
OK = (200, json.dumps({"choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]}
                      ).encode())
KV = {**BODY, "kv_transfer_params": {"do_remote_decode": True}}
# case: (how to get it, its status, final: a retry cannot succeed, what to patch first)
CASES: dict[str, tuple[Callable[[], Answer], int, bool, Callable[..., None] | None]] = {
    "not ready within hold_timeout": (_scripted(OK, hold=0.3, state=Readiness.HOLD), 503,
                                      False, None),
    "vllmwatch stopping": (_scripted(OK, state=Readiness.CLOSED), 503, False, None),
    "failed unanswered, not replayable": (_scripted("reset", path="/v1/responses"), 502,
                                          False, None),
    "failed unanswered, a KV handle": (_scripted("reset", body=KV), 502, True, None),
    "no answer within UPSTREAM_IDLE": (_scripted(("stream-hang",)), 504, False, lambda mp: (
        mp.setattr(exchange, "UPSTREAM_IDLE", 0.5))),
    "bodies held at their cap": (_scripted(OK), 503, False, lambda mp: (
        mp.setattr(guard, "MAX_HELD", 16))),
    "vLLM's head unreadable": (_raw(BIG_HEAD), 502, True, None),
    "aiohttp's handler timeout": (_scripted(OK), 504, False, _handler_timeout),
    "a handler that raised": (_scripted(OK), 500, False, _handler_crash),
}


@pytest.mark.parametrize(("ask", "status", "final", "patch"), list(CASES.values()),
                         ids=list(CASES))
def test_every_5xx_of_the_gates_own_says_when_to_retry_or_never(
        ask: Callable[[], Answer], status: int, final: bool, patch: Callable[..., None] | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if patch is not None:
        patch(monkeypatch)
    got, headers, body = ask()
    assert got == status, body
    assert status in (500, 502, 503, 504)
    if final:
        assert headers.get("X-Should-Retry") == "false" and "Retry-After" not in headers, headers
    else:
        assert int(headers["Retry-After"]) >= 1 and "X-Should-Retry" not in headers, headers
    assert json.loads(body)["code"] == status, body  # the gate's own, in the API's shape


def test_the_shed_503_says_when_to_retry_by_the_same_rule() -> None:
    """The shed answers before any request is parsed (raw bytes): its Retry-After is the
    rule's figure for a 5xx whose caller names none."""
    head_, _, _ = shed._SHED.partition(b"\r\n\r\n")
    assert head_.startswith(b"HTTP/1.1 503 ")
    assert b"\r\nRetry-After: %d" % guard.RETRY_SOON in head_


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_crashed_handler_answers_the_apis_json_error_never_aiohttps_page(
        path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp's own 500 was a text page (HTML for a browser's Accept) with no retry header:
    an SDK could neither parse it nor tell when to retry. Now the path's API error shape."""
    _handler_crash(monkeypatch)
    with setup(OK) as (g, _script, _d):
        conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=60 * TIMEOUT_SCALE)
        try:
            conn.request("POST", path, json.dumps(BODY), {"Content-Type": "application/json",
                                                          "Accept": "text/html, */*"})
            resp = conn.getresponse()
            status, headers, body = resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()
        settle(g)
    assert status == 500 and headers["Content-Type"].startswith("application/json"), body
    assert int(headers["Retry-After"]) >= 1, headers
    err = json.loads(body)
    if path == "/v1/messages":
        assert err["type"] == "error" and err["error"]["type"] == "api_error", err
    else:
        assert err["object"] == "error" and err["type"] == "InternalServerError", err
    assert b"a bug of the gate's" not in body  # (the log has it; the client gets no trace)
