"""Issue 24's phases: hangs seen within 10 s at vllmwatch's shipped [probe] defaults, and no
false restart under load, on the Qwen3-8B-shaped model.

  hangstop  one daemon at the shipped [probe] defaults: EngineCore SIGSTOP five times (the
            worst detect time counts); each: detect (restart.begin after the stop), the
            verdict's trail (probe.canary_timeout/retry/busy), the host's CPU pressure at the
            fault, the stopped engine killed by vllmwatch, READY again; then, if time is
            left, one more under 16 clients (what the requests in flight got)
  hangload  the same config: 64 clients, ~2,000-token prompts, 128 tokens out, for 5
            minutes: no restart expected; a 1-token canary of our own every second measures
            how long vLLM's scheduler makes the canary wait under that load
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from bench.gpu import loadgen as LG
from bench.gpu.calls import completion
from bench.gpu.config import big_config
from bench.gpu.daemon import GpuDaemon
from bench.gpu.inject import inject_fault, serving, under_load
from bench.gpu.models import ensure_big
from bench.gpu.procs import find_titled
from bench.gpu.run import Run

RUNS = 5
DRY_RUNS = 2  # the dry run proves the steps, not the worst of five: ~12 s of verdict each
LOAD_S = 300.0
CLIENTS = 64
LONG_PROMPT = LG.PROMPT * 5  # ~8,800 characters: ~2,000 Qwen3 tokens
VERDICT = ("probe.canary_timeout", "probe.canary_retry", "probe.canary_busy")


def _daemon(run: Run, name: str, n: int) -> tuple[GpuDaemon, int]:
    port = run.port(n)
    # Six hangs in a row are the point here, not a crash loop: each counts as the first
    # failure after a stable run (stable_after), and the guard allows them all.
    conf = big_config(run, name, port, run.status_port(n), run.work / "cache8b",
                      shipped_probe=True, restart={"max_restarts": 50, "stable_after": "15s"})
    run.emit(name, "start", gpu=run.wait_idle_gpu())
    return GpuDaemon(run, name, conf, f"{name}-vllmwatch.log"), port


def _sigstop(d: GpuDaemon, what: str, port: int) -> float | None:
    """One EngineCore SIGSTOP through inject_fault; the detect time and the verdict's trail."""
    mark, t_fault = d.count(), d.now()
    psi = d.run.sh("cat /proc/pressure/cpu /proc/loadavg", timeout=5)
    inject_fault(d, what, port, "q8b", find_titled("VLLM::EngineCore", d.pid), signal.SIGSTOP)
    begin = d.named("restart.begin", mark)
    detect = round(begin[0]["t"] - t_fault, 2) if begin else None
    keys = ("event", "t", "timeout_s", "retry_timeout_s", "host_saturated")
    trail = sorted(({k: e.get(k) for k in keys} for name in VERDICT
                    for e in d.named(name, mark)), key=lambda e: float(e["t"] or 0))
    d.run.emit(d.phase, what + "_verdict", detect_s=detect,
               reason=begin[0].get("reason") if begin else None,
               detail=begin[0].get("detail") if begin else None, host_cpu_at_fault=psi,
               trail=trail[:6], engines_killed=d.named("child.engines_killed", mark)[:1])
    return detect


def hangstop(run: Run) -> None:
    ensure_big(run)
    d, port = _daemon(run, "hangstop", 14)
    detects: list[float | None] = []
    runs = DRY_RUNS if run.dry else RUNS
    try:
        if not serving(d, "ready", port, "q8b"):
            return
        for i in range(runs):
            if run.left() < 100:
                run.emit("hangstop", "skipped", runs_left=runs - i, left_s=round(run.left()))
                break
            # Canary history under this engine (every 2 s), and the start's CPU burst out of
            # PSI's 10 s average: a saturated host would get the 4x retry (~12 s).
            run.pause(20)
            detects.append(_sigstop(d, f"sigstop_{i + 1}", port))
        seen = [x for x in detects if x is not None]
        run.emit("hangstop", "summary", runs=len(detects), detect_s=detects,
                 worst_s=max(seen) if seen else None, all_detected=len(seen) == len(detects))
        if run.left() > 110:
            run.pause(20)
            under_load(d, "sigstop_loaded", [port], "q8b",
                       lambda: _sigstop(d, "sigstop_loaded", port))
    finally:
        d.stop_and_check()


def _canaries(port: int, stop: threading.Event, out: list[dict[str, Any]]) -> None:
    """A 1-token completion of a short prompt every second, as vllmwatch's canary is."""
    while not stop.is_set():
        r = completion(port, "q8b", max_tokens=1, timeout=60)
        out.append({"s": r.get("seconds"), "status": r.get("status")})
        stop.wait(1.0)


def hangload(run: Run) -> None:
    ensure_big(run)
    d, port = _daemon(run, "hangload", 15)
    try:
        if not serving(d, "ready", port, "q8b"):
            return
        span = min(LOAD_S * run.time_scale, max(30.0 * run.time_scale, run.left() - 60))
        mark = d.count()
        ld = LG.Load([port], "q8b", CLIENTS, max_tokens=128, prompt=LONG_PROMPT).start()
        stop, lat = threading.Event(), list[dict[str, Any]]()
        th = threading.Thread(target=_canaries, args=(port, stop, lat), daemon=True)
        t0 = time.monotonic()
        run.pause(10)  # the clients ramp up first: our canary measures the loaded engine
        th.start()
        time.sleep(max(0.0, span - 10 * run.time_scale))
        t1 = time.monotonic()
        stop.set()
        recs = ld.stop()
        th.join(70)
        secs = sorted(x["s"] for x in lat if x["status"] == 200 and x["s"] is not None)
        run.emit("hangload", "load", seconds=round(t1 - t0, 1), clients=CLIENTS,
                 max_tokens=128, prompt_chars=len(LONG_PROMPT),
                 **LG.summary(recs, t0 + 10 * run.time_scale, t1),
                 restarts=d.named("restart.begin", mark),
                 verdicts={n: len(d.named(n, mark)) for n in VERDICT},
                 canary_under_load_s={"n": len(secs), "p50": LG.pct(secs, 0.5),
                                      "p95": LG.pct(secs, 0.95),
                                      "max": secs[-1] if secs else None,
                                      "failed": len(lat) - len(secs)},
                 gpu=run.nv.snapshot())
    finally:
        d.stop_and_check()
