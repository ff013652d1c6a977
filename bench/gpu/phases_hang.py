"""Issue 24 on the H200: hangs seen within 10 s at the shipped [probe] defaults, and no false
restart under load. Registered into drive.PHASES (drive.py imports this module).

  hangstop  8B-shaped model, one daemon at the shipped [probe] defaults: EngineCore SIGSTOP
            five times, each: detect (restart.begin after the stop), the verdict's events, the
            stopped engine gone (SIGKILL works on a stopped process), READY again; then one
            more under 16 clients if time is left (what in-flight requests got)
  hangload  the same daemon config: 64 clients, ~2,000-token prompts, 128 tokens out, for
            5 minutes; no restart expected. A 1-token "canary" of our own every second
            measures how long vLLM's scheduler makes the canary wait under that load.

`python bench/gpu/drive.py hangstop` and `... hangload` (each fits one 540 s call once the
compile cache is warm; hangstop skips the runs that no longer fit and says so).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import drive as D
import loadgen as LG
import phases_gpu as G

RUNS = 5
LOAD_S = 300.0
CLIENTS = 64
# ~2,000 Qwen3 tokens: LG.PROMPT is ~1,770 characters (~400 tokens).
LONG_PROMPT = LG.PROMPT * 5
EVENTS = ("probe.canary_timeout", "probe.canary_retry", "probe.canary_busy", "restart.begin",
          "child.stopping", "child.kill", "child.exited", "gpu.released", "child.started")


def shipped_probe(path: Path) -> Path:
    """drive.watch_config with its [probe] section emptied: vllmwatch's shipped defaults."""
    text = path.read_text()
    text = re.sub(r"\[probe\]\n(?:[a-z_]+ = .*\n)*", "[probe]\n", text)
    path.write_text(text)
    return path


def config(name: str, port: int, status_port: int) -> Path:
    return shipped_probe(G.big_config(name, port, status_port, D.WORK / "cache8b"))


def stop_engine(d: D.Daemon, run: str, port: int) -> float | None:
    """SIGSTOP the EngineCore; the detect time (None if no restart), READY again."""
    engine = D.find_titled("VLLM::EngineCore", d.p.pid)
    if engine is None:
        D.emit("hangstop", run, error="no VLLM::EngineCore", tree=[t for _, _, t in G.tree(d)])
        return None
    old, mark, t_fault = G.tree(d), d.log.count(), d.now()
    psi = D.sh("cat /proc/pressure/cpu; cat /proc/loadavg", timeout=5)
    os.kill(engine, signal.SIGSTOP)
    try:
        idx, t_ready, ev = d.ready(mark, timeout=min(300.0, max(30.0, D.left() - 25)))
    finally:  # never leave a stopped process behind, whatever happened (same pid AND start)
        for pid, started, _ in old:
            if pid == engine and G.survivors([(pid, started, "")]):
                with contextlib.suppress(OSError):
                    os.kill(engine, signal.SIGKILL)
    begin = d.log.named("restart.begin", mark)
    detect = round(begin[0]["t"] - t_fault, 2) if begin else None
    D.emit("hangstop", run, engine_pid=engine, detect_s=detect, host_cpu_at_fault=psi,
           reason=begin[0].get("reason") if begin else None,
           ready_again_after_fault_s=round(t_ready - t_fault, 2)
           if idx >= 0 and ev.get("event") == "child.ready" else None,
           events=G.events_after(d, mark, t_fault, *EVENTS),
           verdict_trail=sorted(({k: e.get(k) for k in ("event", "t", "timeout_s",
                                                        "retry_timeout_s", "host_saturated")}
                                 for n in EVENTS[:3] for e in d.log.named(n, mark)),
                                key=lambda e: e["t"])[:6],
           old_tree=G.survivors(old), engine_alive=Path(f"/proc/{engine}").exists())
    return detect


def phase_hangstop() -> None:
    G.ensure_big()
    d = D.Daemon("hangstop", config("hangstop", 8114, 9124), "hangstop-vllmwatch.log")
    detects: list[float | None] = []
    try:
        if not G.start(d, "ready", 8114, "q8b"):
            return
        for i in range(RUNS):
            if D.left() < 100:
                D.emit("hangstop", "skipped", runs_left=RUNS - i, left_s=round(D.left()))
                break
            # Canary history under the new engine (2 s interval), and the start's CPU burst
            # (compile, CUDA graphs) out of PSI's 10 s average: a saturated host would get
            # the 4x retry (12 s), the idle row of the table is what is measured here.
            time.sleep(20)
            detects.append(stop_engine(d, f"sigstop_{i + 1}", 8114))
        seen = [x for x in detects if x is not None]
        D.emit("hangstop", "summary", runs=len(detects), detect_s=detects,
               worst_s=max(seen) if seen else None, all_detected=len(seen) == len(detects))
        if D.left() > 110:
            time.sleep(8)
            G.fault_under_load(d, "hangstop", "sigstop_loaded", [8114], "q8b",
                               D.find_titled("VLLM::EngineCore", d.p.pid), signal.SIGSTOP)
    finally:
        G.stop_and_check(d)


def canaries(port: int, stop: threading.Event, out: list[dict[str, Any]]) -> None:
    """A 1-token completion of a short prompt every second, as vllmwatch's canary is."""
    while not stop.is_set():
        r = D.completion(port, "q8b", max_tokens=1, timeout=60)
        out.append({"s": r.get("seconds"), "status": r.get("status")})
        stop.wait(1.0)


def phase_hangload() -> None:
    G.ensure_big()
    d = D.Daemon("hangload", config("hangload", 8115, 9125), "hangload-vllmwatch.log")
    try:
        if not G.start(d, "ready", 8115, "q8b"):
            return
        span = min(LOAD_S, max(30.0, D.left() - 60))
        mark = d.log.count()
        ld = LG.Load([8115], "q8b", CLIENTS, max_tokens=128, prompt=LONG_PROMPT).start()
        stop, lat = threading.Event(), list[dict[str, Any]]()
        th = threading.Thread(target=canaries, args=(8115, stop, lat), daemon=True)
        t0 = time.monotonic()
        time.sleep(10)  # the clients ramp up first: our canary measures the loaded engine
        th.start()
        time.sleep(max(0.0, span - 10))
        t1 = time.monotonic()
        stop.set()
        recs = ld.stop()
        th.join(70)
        secs = sorted(x["s"] for x in lat if x["status"] == 200 and x["s"] is not None)
        D.emit("hangload", "load", seconds=round(t1 - t0, 1), clients=CLIENTS, max_tokens=128,
               prompt_chars=len(LONG_PROMPT), **LG.summary(recs, t0 + 10, t1),
               restarts=d.log.named("restart.begin", mark),
               verdicts={n: len(d.log.named(n, mark)) for n in EVENTS[:3]},
               canary_under_load_s={"n": len(secs), "p50": LG.pct(secs, 0.5),
                                    "p95": LG.pct(secs, 0.95), "max": secs[-1] if secs
                                    else None, "failed": len(lat) - len(secs)},
               gpu=D.NV.snapshot())
    finally:
        G.stop_and_check(d)


D.PHASES.update(hangstop=phase_hangstop, hangload=phase_hangload)
D.ORDER.extend(["hangstop", "hangload"])
D.EST.update(hangstop=480, hangload=460)
