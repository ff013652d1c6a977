"""Issue 35 end to end: the real CPU vLLM behind the gate, an EngineCore SIGKILL and then a
SIGSTOP (hang) under load, with replay on and off.

Clients: 8 threads of non-streamed completions and 4 of streamed chat completions, back to
back, plain HTTP (http.client: no retries of its own; the `openai` package is not installed
in .venv, so the OpenAI client with max_retries=0 is replaced by this). With replay on, no
non-streamed request fails and every stream either completes or ends with a parseable
`data: {"error": ...}` event; the gate's counters match what the clients saw. With replay
off, the SIGKILL gives today's 502s.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import real_vllm_config
from tests.e2e.e2e_harness import SERVED_NAME, after, find_in_tree, record_times, status
from tests.support import TIMEOUT_SCALE, Daemon, free_port, wait_for

pytestmark = pytest.mark.e2e

STARTUP = 300.0 / TIMEOUT_SCALE
StartDaemon = Callable[..., Daemon]


def completion(port: int) -> str:
    body = json.dumps({"model": SERVED_NAME, "prompt": "Tell me about the sea",
                       "max_tokens": 16, "ignore_eos": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        return "ok" if resp.status == 200 and b"choices" in data else f"HTTP {resp.status}"
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__
    finally:
        conn.close()


def stream(port: int) -> str:
    """ok: [DONE] came; error-event: a parseable error event ended it; else what broke."""
    body = json.dumps({"model": SERVED_NAME, "stream": True, "max_tokens": 48,
                       "ignore_eos": True, "messages": [{"role": "user", "content": "Hi"}]})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", "/v1/chat/completions", body,
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return f"HTTP {resp.status}"
        for line in resp:
            if line.startswith(b"data: [DONE]"):
                return "ok"
            if line.startswith(b"data: ") and "error" in json.loads(line[6:]):
                return "error-event"
        return "ended without [DONE]"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return type(exc).__name__
    finally:
        conn.close()


class Load:
    """8 completion and 4 stream clients, back to back, until stopped."""

    def __init__(self, port: int) -> None:
        self.stop = threading.Event()
        self.outcomes: dict[str, Counter[str]] = {"completion": Counter(), "stream": Counter()}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(kind, fn), daemon=True)
                        for kind, fn, n in (("completion", completion, 8), ("stream", stream, 4))
                        for _ in range(n)]
        self.port = port
        for t in self.threads:
            t.start()

    def _run(self, kind: str, fn: Callable[[int], str]) -> None:
        while not self.stop.is_set():
            out = fn(self.port)
            with self.lock:
                self.outcomes[kind][out] += 1

    def total(self) -> int:
        with self.lock:
            return sum(sum(c.values()) for c in self.outcomes.values())

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(320)


def gated(tmp_path: Path, venv: Path, model: Path, replay: bool) -> tuple[dict[str, object],
                                                                        int]:
    cfg = real_vllm_config(venv, model, tmp_path)
    port = free_port()
    cfg["gate"] = {"enabled": True, "listen": f"127.0.0.1:{port}", "replay": replay}
    return cfg, port


def fault(d: Daemon, load: Load, how: str, since: int = 0) -> int:
    """SIGKILL or SIGSTOP the EngineCore of the child that was ready after `since`, under
    load; wait until vLLM serves again and answers flow. The mark of that new READY."""
    pid = d.wait_ready(STARTUP, since)["pid"]
    wait_for(lambda: load.total() >= 12, 120, "answers before the fault")
    engines = find_in_tree(pid, "VLLM::EngineCore")
    assert len(engines) == 1, "no single VLLM::EngineCore in the tree"
    mark = d.mark()
    if how == "kill":
        engines[0].kill()
    else:
        engines[0].suspend()  # the teardown SIGCONTs and kills whatever is left
    begin = d.wait_event("restart.begin", 60, mark)
    back = after(d, begin)
    d.wait_ready(STARTUP, back)
    n = load.total()
    wait_for(lambda: load.total() >= n + 12, 120, "answers after the restart")
    return back


def test_replay_hides_an_enginecore_kill_and_a_hang(
        start_daemon: StartDaemon, tmp_path: Path, vllm_venv: Path, tiny_model: Path) -> None:
    cfg, port = gated(tmp_path, vllm_venv, tiny_model, replay=True)
    d = start_daemon(config=cfg)
    d.wait_ready(STARTUP)
    load = Load(port)
    try:
        fault(d, load, "stop", fault(d, load, "kill"))
    finally:
        load.close()
    g = status(d)["gate"]
    done, streams = load.outcomes["completion"], load.outcomes["stream"]
    record_times("gate_replay_real", {"completions": dict(done), "streams": dict(streams),
                                      "gate": {k: g[k] for k in (
                                          "replayed", "replay_answered", "replay_gave_up",
                                          "not_replayed", "cut_midstream", "stop_orders",
                                          "forwarded_after_stop")}})
    assert set(done) == {"ok"}, (done, g)  # 0 non-streamed requests failed
    assert set(streams) <= {"ok", "error-event"}, (streams, g)
    assert streams["error-event"] == g["cut_midstream"], (streams, g)
    assert g["replayed"] >= 1 and g["replayed"] == g["replay_answered"], g
    assert g["replay_gave_up"] == 0 and g["not_replayed"] == 0, g
    assert g["forwarded_after_stop"] == 0, g


def test_replay_off_is_todays_502(
        start_daemon: StartDaemon, tmp_path: Path, vllm_venv: Path, tiny_model: Path) -> None:
    cfg, port = gated(tmp_path, vllm_venv, tiny_model, replay=False)
    d = start_daemon(config=cfg)
    d.wait_ready(STARTUP)
    load = Load(port)
    try:
        fault(d, load, "kill")
    finally:
        load.close()
    g = status(d)["gate"]
    done = load.outcomes["completion"]
    record_times("gate_replay_off_real", {"completions": dict(done),
                                          "streams": dict(load.outcomes["stream"])})
    failed = sum(n for out, n in done.items() if out != "ok")
    assert failed >= 1 and set(done) - {"ok"} <= {"HTTP 502"}, (done, g)
    assert g["replayed"] == 0 and g["not_replayed"] >= failed, g
