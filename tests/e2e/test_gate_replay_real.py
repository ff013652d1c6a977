"""Issue 35 end to end: the real CPU vLLM behind the gate, an EngineCore SIGKILL and then a
SIGSTOP (hang) under load, with replay on and off.

Clients: the OpenAI Python client with max_retries=0 (no retries of its own): 8 threads of
non-streamed completions and 4 of streamed chat completions, back to back. With replay on,
no non-streamed request fails and every stream either completes or ends with the error
event the client parses (openai.APIError); the gate's counters match what the clients saw,
and each incident record says what became of the requests in flight. With replay off, the
SIGKILL gives today's 502s.

The issue asks for 60 s of load around each fault: VLLMWATCH_REPLAY_LOAD_S=60 (the figures in
docs/BENCHMARKS.md section 12 were taken so). The suite's default is shorter (LOAD_S): each
fault also waits for vLLM to start again, ~45-70 s on this 2-core box shared with others, and
at 60 s of load per fault this module took 8 min 45 s under the heavy lock (both tests,
2026-12-02; 5 min 18 s at the default 20 s), for the same assertions (answers before and
after each fault either way).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import real_vllm_config
from tests.e2e.e2e_harness import SERVED_NAME, after, find_in_tree, record_times, status
from tests.support import TIMEOUT_SCALE, Daemon, free_port, sigstop, wait_for

openai = pytest.importorskip("openai", reason="the OpenAI client is in the dev extra")

pytestmark = pytest.mark.e2e

STARTUP = 300.0 / TIMEOUT_SCALE
LOAD_S = float(os.environ.get("VLLMWATCH_REPLAY_LOAD_S", "20"))  # of load around each fault
StartDaemon = Callable[..., Daemon]


def client(port: int) -> Any:
    """The OpenAI client, no retries of its own: every failure the gate lets through shows."""
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                         max_retries=0, timeout=300.0)


def completion(c: Any) -> str:
    try:
        r = c.completions.create(model=SERVED_NAME, prompt="Tell me about the sea",
                                 max_tokens=16, extra_body={"ignore_eos": True})
        return "ok" if r.choices and r.choices[0].text else "empty"
    except openai.APIStatusError as exc:
        return f"HTTP {exc.status_code}"
    except openai.APIError as exc:
        return type(exc).__name__


def stream(c: Any) -> str:
    """ok: it finished; error-event: the parseable error event ended it (openai.APIError
    itself, raised by the client's SSE parser); else what broke."""
    try:
        finished = False
        for chunk in c.chat.completions.create(
                model=SERVED_NAME, stream=True, max_tokens=48, extra_body={"ignore_eos": True},
                messages=[{"role": "user", "content": "Hi"}]):
            finished = finished or any(ch.finish_reason for ch in chunk.choices)
        return "ok" if finished else "ended without a finish"
    except openai.APIStatusError as exc:
        return f"HTTP {exc.status_code}"
    except openai.APIError as exc:
        return "error-event" if type(exc) is openai.APIError else type(exc).__name__
    except Exception as exc:  # what the client library lets through: counted, shown
        return type(exc).__name__


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

    def _run(self, kind: str, fn: Callable[[Any], str]) -> None:
        c = client(self.port)  # one per thread
        while not self.stop.is_set():
            out = fn(c)
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
    # The hold outlasts any restart this box makes: the test is about what replay hides, and a
    # loaded run (CPU hogs, the other lane) took the hang's restart past the 2 min default,
    # so 9 held requests got their 503 (hold_timeouts 9) before vLLM was back.
    cfg["gate"] = {"enabled": True, "listen": f"127.0.0.1:{port}", "replay": replay,
                   "hold_timeout": "10m"}
    return cfg, port


def fault(d: Daemon, load: Load, how: str, since: int = 0) -> int:
    """SIGKILL or SIGSTOP the EngineCore of the child that was ready after `since`, in the
    middle of LOAD_S seconds of load; wait until vLLM serves again and answers flow for the
    rest of it. The mark of that new READY."""
    pid = d.wait_ready(STARTUP, since)["pid"]
    t0, n0 = time.monotonic(), load.total()
    wait_for(lambda: load.total() >= n0 + 12 and time.monotonic() - t0 >= LOAD_S / 2,
             120 + LOAD_S, "answers before the fault")
    engines = find_in_tree(pid, "VLLM::EngineCore")
    assert len(engines) == 1, "no single VLLM::EngineCore in the tree"
    mark = d.mark()
    if how == "kill":
        engines[0].kill()
    else:
        sigstop(engines[0].pid)  # the teardown SIGCONTs and kills whatever is left
    begin = d.wait_event("restart.begin", 60, mark)
    back = after(d, begin)
    d.wait_ready(STARTUP, back)
    t1, n = time.monotonic(), load.total()
    wait_for(lambda: load.total() >= n + 12 and time.monotonic() - t1 >= LOAD_S / 2,
             120 + LOAD_S, "answers after the restart")
    return back


def incident_figures(d: Daemon) -> list[dict[str, Any]]:
    """The gate's figures in each incident record of this daemon (issue 35's line)."""
    out = []
    for ev in d.named("incident.recorded"):
        record = json.loads((Path(ev["incident_path"]) / "record.json").read_text())
        out.append({"reason": record["reason"], **(record.get("gate") or {})})
    return out


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
    records = incident_figures(d)
    record_times("gate_replay_real", {
        "client": f"openai {openai.__version__}, max_retries=0", "load_s_per_fault": LOAD_S,
        "completions": dict(done), "streams": dict(streams), "incidents": records,
        "gate": {k: g[k] for k in ("forwarded", "replayed", "replay_answered",
                                   "replay_gave_up", "not_replayed", "cut_midstream",
                                   "stop_orders", "forwarded_after_stop", "hold_timeouts")}})
    assert set(done) == {"ok"}, (done, g)  # 0 non-streamed requests failed
    assert set(streams) <= {"ok", "error-event"}, (streams, g)
    assert streams["error-event"] == g["cut_midstream"], (streams, g)
    assert g["replayed"] >= 1 and g["replayed"] == g["replay_answered"], g
    assert g["replay_gave_up"] == 0 and g["not_replayed"] == 0, g
    # Every request the clients sent was sent once, plus once more per replay: nothing
    # else went to vLLM through the gate, and nothing after an engine's stop order.
    assert g["forwarded"] == load.total() + g["replayed"], (g, load.total())
    assert g["forwarded_after_stop"] == 0, g
    assert len(records) == 2 and records[1]["reason"] == "hang", records
    for r in records:  # the record's line adds up, and names what was in flight
        assert r["in_flight"] == r["failed"] + r["cut"] + r["answered"] + r["open"], r
        assert r["failed"] == r["replayed"] + r["not_replayed"], r
    assert sum(r["replayed"] for r in records) <= g["replayed"], (records, g)
    assert records[1]["in_flight"] >= 1 and records[1]["open"] == 0, records  # cut at the verdict


def test_replay_off_is_todays_502(
        start_daemon: StartDaemon, tmp_path: Path, vllm_venv: Path, tiny_model: Path) -> None:
    cfg, port = gated(tmp_path, vllm_venv, tiny_model, replay=False)
    d = start_daemon(config=cfg)
    d.wait_ready(STARTUP)
    load = Load(port)
    try:
        # A kill can find no request of the load at vLLM (CI saw it once: 500 ok, the record's
        # in_flight 0), and then there is no failure to see: kill again, up to three times.
        back = 0
        for _ in range(3):
            back = fault(d, load, "kill", back)
            with load.lock:
                if sum(n for out, n in load.outcomes["completion"].items() if out != "ok"):
                    break
    finally:
        load.close()
    g = status(d)["gate"]
    done = load.outcomes["completion"]
    record_times("gate_replay_off_real", {
        "client": f"openai {openai.__version__}, max_retries=0", "load_s_per_fault": LOAD_S,
        "completions": dict(done), "streams": dict(load.outcomes["stream"]),
        "incidents": incident_figures(d)})
    failed = sum(n for out, n in done.items() if out != "ok")
    assert failed >= 1 and set(done) - {"ok"} <= {"HTTP 502"}, (done, g)
    assert g["replayed"] == 0 and g["not_replayed"] >= failed, g
