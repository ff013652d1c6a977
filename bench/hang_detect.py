"""Issue 24: how fast vllmwatch sees a hung engine at the shipped [probe] defaults, what the
requests in flight get, and how long a 1-token canary waits behind client load.

    .venv/bin/python -m bench.hang_detect [--runs 5] [--hogs 0] [--clients 4]

With the real CPU vLLM (tiny model): vllmwatch at its shipped [probe] defaults (restart
settings relaxed so that N hangs in a row are not a crash loop). Then:
  canary   1-token canaries of a short prompt, one a second, idle and then while `--clients`
           clients send completions (a 100-word prompt, 64 tokens): how long vLLM's
           scheduler makes the canary wait under load
  sigstop  `--runs` times: SIGSTOP of VLLM::EngineCore -> restart.begin (detect), the verdict's
           trail, READY again; the last run with `--clients` clients in flight, whose
           outcomes (status or error, seconds after the stop) are recorded
`--hogs N` keeps N extra processes spinning on the CPUs meanwhile (a starved host).
Writes bench/results/hang_detect[-hogsN][-TAG].json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench._common import (
    SERVED,
    Watch,
    find_in_tree,
    free_port,
    machine,
    save,
    say,
    stats,
    track_group,
    write_config,
)
from vllmwatch.shell.probes import sample_host_cpu as host_cpu
from vllmwatch.testing.lb import post_completion

# Long for the tiny model's byte-level tokenizer, within its max-model-len of 2048 tokens (the
# H200 phase, bench/gpu/phases/hangs.py, sends ~2,000-token prompts to the 8B shape).
LONG = "Tell me about the sea " * 20


def request(port: int, prompt: str, max_tokens: int, timeout: float) -> tuple[str, float]:
    """One completion: (outcome, seconds); outcome "200", "HTTP n" or the exception name."""
    body = json.dumps({"model": SERVED, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True})
    return post_completion(port, body, timeout)


class Clients:
    """Closed-loop clients; every request is (start, end, outcome)."""

    def __init__(self, port: int, n: int) -> None:
        self.port, self.stop = port, threading.Event()
        self.recs: list[tuple[float, float, str]] = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            out, took = request(self.port, LONG, 64, 120)
            self.recs.append((t0, t0 + took, out))
            if out != "200":
                self.stop.wait(0.5)

    def close(self) -> list[tuple[float, float, str]]:
        self.stop.set()
        for t in self.threads:
            t.join(130)
        return self.recs


def canary_latency(port: int, seconds: float) -> dict[str, Any]:
    secs = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out, took = request(port, "Hello", 1, 60)
        if out == "200":
            secs.append(took)
        time.sleep(1.0)
    got: dict[str, Any] = stats(secs, 3)
    return got


def sigstop(w: Watch, port: int, clients: int) -> dict[str, Any]:
    ready = w.wait_event("child.ready", 0, 1)
    pid = w.child_pid()
    assert pid is not None and ready is not None
    engine = find_in_tree(pid, "VLLM::EngineCore")[0]
    load = Clients(port, clients) if clients else None
    time.sleep(5 if clients else 0)
    cpu = host_cpu()
    t0 = time.monotonic()
    engine.suspend()
    try:
        got = w.wait_event("restart.begin", t0, 120)
        back = w.wait_event("child.ready", t0, 300)
    finally:
        with contextlib.suppress(Exception):
            engine.kill()
    row: dict[str, Any] = {
        "detect_s": round(got[0] - t0, 2) if got else None,
        "reason": got[1]["reason"] if got else None, "detail": got[1]["detail"] if got else "",
        "ready_again_s": round(back[0] - t0, 2) if back else None,
        "psi_some_avg10": cpu.psi_some_avg10, "load_per_cpu": cpu.load_per_cpu,
        "trail": [{"at_s": round(t - t0, 2), "event": e["event"],
                   **{k: e[k] for k in ("timeout_s", "retry_timeout_s", "host_saturated")
                      if k in e}}
                  for name in ("probe.canary_timeout", "probe.canary_retry", "probe.canary_busy",
                               "child.stopping", "child.kill", "child.exited")
                  for t, e in w.since(t0, name)]}
    row["trail"].sort(key=lambda x: x["at_s"])
    if load is not None:
        recs = load.close()
        inflight = [(s, e, o) for s, e, o in recs if s < t0 < e]
        row["in_flight"] = [{"outcome": o, "ended_after_stop_s": round(e - t0, 2)}
                            for s, e, o in inflight]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hogs", type=int, default=0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--canary-seconds", type=float, default=30.0)
    ap.add_argument("--tag", default="", help="suffix of the results file")
    a = ap.parse_args()
    hogs = []
    for _ in range(a.hogs):
        p = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        track_group(p.pid)
        hogs.append(p)
    tmp = Path(tempfile.mkdtemp(prefix="hang-detect-"))
    port = free_port()
    conf = write_config(tmp / "vw.toml", port, free_port(), tmp / "cache", {
        "restart": {"max_restarts": 50, "stable_after": "20s", "backoff_initial": "1s"},
        "prewarm": {"enabled": False}})
    w = Watch(conf, tmp / "vllmwatch.log")
    out: dict[str, Any] = {"machine": machine(), "hogs": a.hogs, "clients": a.clients,
                           "probe": "shipped defaults", "runs": []}
    try:
        assert w.wait_event("child.ready", 0, 400), "vllmwatch never READY"
        time.sleep(6)
        out["canary_idle_s"] = canary_latency(port, a.canary_seconds)
        load = Clients(port, a.clients)
        time.sleep(5)
        out["canary_under_load_s"] = canary_latency(port, a.canary_seconds)
        recs = load.close()
        out["load_requests"] = {"ok": sum(o == "200" for _, _, o in recs),
                                "failed": sorted({o for _, _, o in recs if o != "200"}),
                                "seconds": stats([e - s for s, e, o in recs if o == "200"])}
        say("canary idle", out["canary_idle_s"], "under load", out["canary_under_load_s"])
        for i in range(a.runs):
            assert w.wait_event("child.ready", 0, 300)
            time.sleep(8)  # canary history under this engine
            row = sigstop(w, port, a.clients if i == a.runs - 1 else 0)
            say(f"run {i + 1}:", {k: v for k, v in row.items() if k != "trail"})
            out["runs"].append(row)
        det = [r["detect_s"] for r in out["runs"] if r["detect_s"] is not None]
        out["detect_s"] = stats(det)
        out["worst_detect_s"] = max(det) if det else None
    finally:
        w.stop()
        for p in hogs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
    save("hang_detect" + (f"-hogs{a.hogs}" if a.hogs else "") + (f"-{a.tag}" if a.tag else ""),
         out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
