"""`vllmwatch run` behind the gate, over the fake vLLM whose engine crashes on one prompt:
clients that retry as the openai package does (a 5xx or a dropped connection twice more, a
4xx never) no longer crash-loop vLLM until vllmwatch gives up (exit 75 after 5 restarts).
The culprit is quarantined after three engine deaths, the innocents beside it are answered,
and vLLM serves on (gate/replay.py Suspects; the gate tier is tests/shell/test_gate_poison).
"""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path

from tests.support import TIMEOUT_SCALE, Daemon, base_config, free_port, merge, wait_for

POISON = "POISON"


def openai_like(port: int, prompt: str) -> list[int]:
    """The statuses of one request sent the way the openai package sends it: retried twice
    on a 408/409/429/5xx or a connection error, never on another 4xx (-1: connection)."""
    got: list[int] = []
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 2})
    for _ in range(3):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120 * TIMEOUT_SCALE)
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            got.append(resp.status)
        except (OSError, http.client.HTTPException):
            got.append(-1)
        finally:
            conn.close()
        if got[-1] != -1 and got[-1] < 500 and got[-1] not in (408, 409, 429):
            break
    return got


def test_a_prompt_that_crashes_the_engine_is_quarantined_and_vllm_serves_on(
        tmp_path: Path) -> None:
    gate_port = free_port()
    cfg = merge(base_config(free_port(), free_port(),
                            ["--crash-on-prompt", POISON, "--slow-completion", "1"]), {
        "gate": {"enabled": True, "listen": f"127.0.0.1:{gate_port}", "hold_timeout": "90s"},
        "probe": {"canary_timeout": "4s"},  # the canary is slow too: above its 1 s
    })
    d = Daemon(tmp_path, cfg).start()
    try:
        d.wait_ready(30)
        since = len(d.events)
        innocents: list[list[int]] = []
        runs = [threading.Thread(target=lambda: innocents.append(openai_like(gate_port, "hi")))
                for _ in range(3)]
        for t in runs:
            t.start()
        wait_for(lambda: json.loads(d.http_get("/status")[1])["gate"]["in_flight"] >= 3, 30,
                 "the innocents in flight at the engine")
        poison = openai_like(gate_port, POISON)
        for t in runs:
            t.join(300 * TIMEOUT_SCALE)
        assert poison[-1] == 422, poison  # quarantined: its client stops retrying
        assert [s[-1] for s in innocents] == [200] * 3, innocents
        quarantined = d.wait_event("gate.quarantined", 10, since)
        gate_events = [e for e in d.events[since:] if e["event"].startswith("gate.")]
        assert quarantined["deaths"] == 3 and POISON not in json.dumps(gate_events)
        # (the gate sees the third death before the daemon's restart.begin is logged)
        wait_for(lambda: len(d.named("restart.begin", since)) >= 3, 30, "the third restart")
        third = d.events.index(d.named("restart.begin", since)[2])
        d.wait_ready(60, since=third)
        assert openai_like(gate_port, "hi again") == [200]  # vLLM serves on
        assert len(d.named("restart.begin", since)) == 3, "one death alone, then no more"
        assert not d.named("crashloop.gave_up", since)
        gate = json.loads(d.http_get("/status")[1])["gate"]
        assert (gate["quarantined"], gate["quarantine_refused"]) == (1, 1), gate
        code, _ = d.stop()
        assert code == 0, d.dump()
    finally:
        d.close()
