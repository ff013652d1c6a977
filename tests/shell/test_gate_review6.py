"""A sixth review of the gate (2026-12-07): its own 502 and 504 carried no Retry-After (its
503s did)."""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any

import pytest

from tests.shell.test_gate_replay import BODY, relaunch_when_tried, settle, setup
from tests.support import TIMEOUT_SCALE
from vllmwatch.gate import exchange


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

