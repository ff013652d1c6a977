"""A sixth review of the gate (2026-12-07): its own 502 and 504 carried no Retry-After (its
503s did); a stream vLLM ended before any event, or with token-free events only, reached the
client as an empty success; a request carrying a disaggregated prefill's KV handle
(kv_transfer_params) was replayed, though the handle is single-use; a live engine's aborted
completion goes to that engine again after SAME_ENGINE_GRACE, which its page did not say."""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any

import pytest

from tests.shell.test_gate_replay import BODY, OK, relaunch_when_tried, settle, setup
from tests.shell.test_gate_split_events import HEAD, _chunk, _gate
from tests.support import TIMEOUT_SCALE, wait_for
from vllmwatch.gate import exchange, proxy


def _ask(port: int, path: str = "/v1/completions", body: dict[str, Any] | None = None
         ) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60 * TIMEOUT_SCALE)
    try:
        conn.request("POST", path, json.dumps(body or BODY),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("case", ["not-replayable", "replay-off", "replay-max", "timeout"])
def test_every_5xx_the_gate_makes_for_a_failure_a_retry_can_cure_says_when(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client's retry policy (the openai package's) reads Retry-After; the gate's 503s had it,
    its 502 (vLLM failed before answering, not sent again) and 504 did not."""
    monkeypatch.setattr(exchange, "UPSTREAM_IDLE", 0.5)  # (read at the sessions' making)
    answers: tuple[Any, ...] = (("stream-hang",),) if case == "timeout" else ("reset",)
    with setup(*answers) as (g, script, d):
        g.forwarder.replay = case != "replay-off"
        path = "/v1/responses" if case == "not-replayable" else "/v1/completions"
        if case == "replay-max":  # failed on its engine, then on the next one too
            got: list[Any] = []
            t = threading.Thread(target=lambda: got.append(_ask(g.port, path)))
            t.start()
            relaunch_when_tried(g, script, d)
            t.join(30 * TIMEOUT_SCALE)
            status, headers, _ = got[0]
        else:
            status, headers, _ = _ask(g.port, path)
        settle(g)
    assert status == (504 if case == "timeout" else 502)
    assert headers.get("Retry-After") == "3", headers  # setup's retry_after


def _events(*events: bytes, end: bool = True) -> Any:
    return lambda c: c.sendall(HEAD + b"".join(_chunk(e) for e in events)
                               + (b"0\r\n\r\n" if end else b""))


FINE = _events(b'data: {"choices":[{"index":0,"text":"ok"}]}\n\n', b"data: [DONE]\n\n")
ROLE = (b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
        b'"finish_reason":null}]}\n\n')


@pytest.mark.parametrize(("path", "dying"), [
    ("/v1/completions", _events()),  # the head, then the chunked body's end at once
    ("/v1/completions", lambda c: c.sendall(  # no length, no chunks: ended by the close
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")),
    ("/v1/chat/completions", _events(ROLE)),  # the role event, then its end: no token
    ("/v1/responses", _events()),  # a path the gate does not read for aborts
], ids=["empty-chunked", "empty-close", "role-then-end", "not-read-path"])
def test_a_stream_that_ends_before_any_token_is_vllm_never_answering(
        path: str, dying: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dying engine's API server may send a stream's 200 head and end its body with no event
    (or only token-free ones): the client got a 200 with nothing in it, a success. It is what
    a dropped connection is: replayed (here to the same engine, which serves on), else a 502."""
    monkeypatch.setattr(proxy, "SAME_ENGINE_GRACE", 0.5)
    with _gate([dying, FINE]) as (port, seen, gate):
        status, headers, body = _ask(port, path, {"prompt": "x", "stream": True})
        wait_for(lambda: gate.snapshot()["in_flight"] == 0, 30, "the exchange ended")
        stats = gate.snapshot()
    if path == "/v1/responses":  # not replayable: a 502 that says so, and when to retry
        assert status == 502 and b"failed before answering" in body, body
        assert "Retry-After" in headers and len(seen) == 1
        return
    assert status == 200 and b'"text":"ok"' in body, body
    assert len(seen) == 2 and stats["replayed"] == 1, stats


KV = {"do_remote_prefill": True, "remote_block_ids": [1, 2, 3], "remote_engine_id": "p0",
      "remote_host": "10.0.0.2", "remote_port": 5600}


@pytest.mark.parametrize("params", [KV, {"do_remote_decode": True}, None])
def test_a_request_with_a_kv_transfer_handle_is_never_replayed(params: Any) -> None:
    """A disaggregated decode request names KV blocks its prefill engine holds only until they
    are read once (then freed for other requests): sent again, it may read another request's
    cache and answer from it. Whether it was read cannot be told from the gate, so no request
    carrying kv_transfer_params is replayed (null is none)."""
    body = {**BODY, "kv_transfer_params": params}
    with setup("reset", (200, OK)) as (g, script, d):
        if params is None:
            got: list[Any] = []
            t = threading.Thread(target=lambda: got.append(_ask(g.port, body=body)))
            t.start()
            relaunch_when_tried(g, script, d)
            t.join(30 * TIMEOUT_SCALE)
            assert got[0][0] == 200 and len(script.seen) == 2
            return
        status, headers, answer = _ask(g.port, body=body)
        settle(g)
        assert status == 502 and b"kv_transfer_params" in answer, answer
        # no "try again in N s" for it, and the openai package's retry (any 502) told not to
        assert "Retry-After" not in headers and headers.get("X-Should-Retry") == "false"
        assert len(script.seen) == 1 and g.stats.replayed == 0 and g.stats.not_replayed == 1


def test_a_live_engines_aborted_completion_goes_to_it_again_after_the_grace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """(docs/operations/replay.md says so) vLLM aborts a completion without being told to stop
    (its dev-mode /pause in abort mode): replayed like a dropped connection, and with no
    restart of that engine begun within SAME_ENGINE_GRACE, sent to it once more."""
    monkeypatch.setattr(proxy, "SAME_ENGINE_GRACE", 0.5)
    aborted = json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "abort"}]})
    with setup((200, aborted.encode()), (200, OK)) as (g, script, _d):
        status, _headers, body = _ask(g.port)
        settle(g)
    assert (status, body) == (200, OK)
    assert [gen for _, gen in script.seen] == [1, 1] and g.stats.replayed == 1
