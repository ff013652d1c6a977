"""Issue 38 end to end: LoRA adapters managed by vllmwatch on the real CPU vLLM (0.32).

A tiny random adapter for the tiny model (tests/support/tinylora.py, written by hand: no
download, no peft) is configured in [[adapters]] behind the gate. One daemon, the cases
combined (each vLLM start costs ~40-60 s on this box):
  1. after READY it answers under its name (its 1-token check ran before READY); a client's
     load through the gate is refused and never reaches vLLM;
  2. after an EngineCore SIGKILL restart, and 3. after a SIGUSR1, it answers again;
  4. with [lora] live = true a second adapter of the same rank added by SIGHUP serves without
     a restart (the child's pid unchanged); 5. removing it unloads it (vLLM: 404);
  6. a SIGHUP to live = false adding it again is a planned restart through the gate under
     client load: 0 requests failed, and it serves after READY.
"""

from __future__ import annotations

import http.client
import json
import signal
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import real_vllm_config
from tests.e2e.e2e_harness import SERVED_NAME, find_in_tree, record_times, status
from tests.support import TIMEOUT_SCALE, Daemon, free_port, wait_for
from tests.support.tinylora import make

pytestmark = pytest.mark.e2e
STARTUP = 300.0 / TIMEOUT_SCALE
StartDaemon = Callable[..., Daemon]


def complete(port: int, model: str) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", "/v1/completions", json.dumps(
            {"model": model, "prompt": "Hello", "max_tokens": 2}),
            {"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, {"raw": raw[:300].decode("utf-8", "replace")}
    except (OSError, http.client.HTTPException) as exc:
        return 0, {"error": type(exc).__name__}
    finally:
        conn.close()


def answers(port: int, model: str) -> None:
    code, body = complete(port, model)
    assert code == 200 and body.get("model") == model and body["choices"], (code, body)


def post(port: int, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class Load:
    """4 clients of the base model and the first adapter, back to back, through the gate."""

    def __init__(self, port: int, models: tuple[str, ...]) -> None:
        self.stop, self.lock, self.outcomes = threading.Event(), threading.Lock(), Counter[str]()
        self.threads = [threading.Thread(target=self._run, args=(port, m), daemon=True)
                        for m in models for _ in range(2)]
        for t in self.threads:
            t.start()

    def _run(self, port: int, model: str) -> None:
        while not self.stop.is_set():
            code, _ = complete(port, model)
            with self.lock:
                self.outcomes["ok" if code == 200 else f"HTTP {code}"] += 1

    def close(self) -> Counter[str]:
        self.stop.set()
        for t in self.threads:
            t.join(320)
        return self.outcomes


def test_adapters_survive_restarts_load_live_and_the_gate_refuses_client_loads(
        start_daemon: StartDaemon, tmp_path: Path, vllm_venv: Path, tiny_model: Path) -> None:
    a1, a2 = str(make(tmp_path / "a1", 8, 1)), str(make(tmp_path / "a2", 8, 2))
    cfg: dict[str, Any] = real_vllm_config(vllm_venv, tiny_model, tmp_path)
    gate = free_port()
    cfg["gate"] = {"enabled": True, "listen": f"127.0.0.1:{gate}"}
    cfg["lora"] = {"live": True, "max_loras": 2}
    cfg["adapters"] = [{"name": "a1", "path": a1}]
    d = start_daemon(config=cfg)
    ready = d.wait_ready(STARTUP)
    launch = d.named("lora.launch")[-1]
    assert (launch["max_lora_rank"], launch["max_loras"], launch["live"]) == (8, 2, True)
    # 1. under its name after READY; a client's load is the gate's to refuse
    answers(gate, "a1")
    answers(gate, SERVED_NAME)
    code, raw = post(gate, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": a2})
    assert code == 404 and b"not a client API path" in raw, raw
    # 2. an EngineCore SIGKILL: the restart comes back with the adapter
    [engine] = find_in_tree(int(ready["pid"]), "VLLM::EngineCore")
    mark = d.mark()
    engine.kill()
    d.wait_event("restart.begin", 60, mark)
    ready = d.wait_ready(STARTUP, mark)
    answers(gate, "a1")
    # 3. SIGUSR1: a planned restart, the same
    mark = d.mark()
    d.signal(signal.SIGUSR1)
    d.wait_event("restart.begin", 60, mark)
    ready = d.wait_ready(STARTUP, mark)
    answers(gate, "a1")
    pid = int(status(d)["child_pid"])
    # 4. live add of the same rank: no restart
    cfg["adapters"] = [{"name": "a1", "path": a1}, {"name": "a2", "path": a2}]
    d.write_config(cfg)
    mark = d.mark()
    d.signal(signal.SIGHUP)
    reloaded = d.wait_event("config.reloaded", 60, mark)
    assert (reloaded["how"], reloaded["adapters_added"]) == ("live", ["a2"]), reloaded
    d.wait_event("lora.loaded", 120, mark, adapter="a2")
    answers(gate, "a2")
    assert int(status(d)["child_pid"]) == pid and not d.named("restart.begin", mark)
    rows = {r["name"]: r["state"] for r in status(d)["adapters"]["managed"]}
    wait_for(lambda: {r["name"]: r["state"] for r in status(d)["adapters"]["managed"]}
             == {"a1": "loaded", "a2": "loaded"}, 60, f"both adapters loaded, {rows}")
    # 5. removed: unloaded
    cfg["adapters"] = [{"name": "a1", "path": a1}]
    d.write_config(cfg)
    mark = d.mark()
    d.signal(signal.SIGHUP)
    d.wait_event("lora.unloaded", 60, mark, adapter="a2")
    code, body = complete(gate, "a2")
    assert code == 404 and "does not exist" in json.dumps(body), (code, body)
    assert int(status(d)["child_pid"]) == pid
    # 6. live = false, adding it again: a planned restart through the gate, 0 failed
    cfg["lora"] = {"live": False, "max_loras": 2}
    cfg["adapters"] = [{"name": "a1", "path": a1}, {"name": "a2", "path": a2}]
    d.write_config(cfg)
    load = Load(gate, (SERVED_NAME, "a1"))
    try:
        wait_for(lambda: sum(load.outcomes.values()) >= 4, 120, "answers before the reload")
        mark = d.mark()
        d.signal(signal.SIGHUP)
        reloaded = d.wait_event("config.reloaded", 60, mark)
        assert (reloaded["how"], reloaded["adapters_added"]) == ("restart", ["a2"]), reloaded
        d.wait_event("restart.begin", 60, mark)
        d.wait_ready(STARTUP, mark)
        n = sum(load.outcomes.values())
        wait_for(lambda: sum(load.outcomes.values()) >= n + 4, 120, "answers after")
    finally:
        outcomes = load.close()
    answers(gate, "a2")
    assert int(status(d)["child_pid"]) != pid
    record_times("adapters_real", {"outcomes": dict(outcomes),
                                   "gate": {k: status(d)["gate"][k] for k in
                                            ("held", "forwarded", "path_refused")}})
    assert set(outcomes) == {"ok"}, outcomes  # 0 failed through the gate
