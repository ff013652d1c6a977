"""Overhead of vllmwatch supervising a real (CPU) vLLM.

    .venv/bin/python -m bench.overhead [--leg-seconds 120] [--ab-reps 3]

1. The pieces of one poll cycle, timed here against the real vLLM: GET /health, GET /metrics
   + parse_metrics on its real body, memory sampling (tree walk, RSS, RSS+PSS).
2. vllmwatch's own CPU time and RSS (psutil on the daemon pid only) over legs of
   --leg-seconds with the vLLM idle and busy (4 clients sending 16-token completions
   back to back), at the default intervals and then at 1 s intervals (every probe, the
   canary, memory and PSS every second; applied with SIGHUP, no restart). CPU per hour is
   extrapolated from the leg.
3. Throughput/latency of the same load (200 completions, concurrency 4) against a bare
   vLLM and the supervised one (1 s intervals), started side by side, legs alternated.
Writes bench/results/overhead.json.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families as full_parse

from bench._common import (
    RESULTS,
    Watch,
    cleanup_at_exit,
    free_port,
    http_get,
    kill_group,
    machine,
    save,
    say,
    start_bare,
    stats,
    timeit,
    wait_completion,
    write_config,
)
from bench._load import run_load
from vllmwatch.config.schema import ProbeConfig
from vllmwatch.shell.memory import host_memory, make_sampler, tree_pids
from vllmwatch.shell.probes import Endpoint, HttpProber, parse_metrics

FAST = {
    "probe": {"interval": "1s", "metrics_interval": "1s", "canary_interval": "1s"},
    "memory": {"sample_interval": "1s", "pss_interval": "1s"},
}


def pieces(port: int, child: int) -> dict[str, Any]:
    prober = HttpProber(Endpoint("127.0.0.1", port, "tiny"),
                        ProbeConfig(timeout=5.0, canary_timeout=30.0))
    _, body = http_get(port, "/metrics")
    text = body.decode()
    sampler = make_sampler([], lambda *a, **k: None)
    pids = tree_pids(child)
    s = sampler.sample(child, True)
    return {
        "metrics_body": {"bytes": len(body), "lines": text.count("\n")},
        "tree": {"pids": len(pids), "rss_mib": round(s.host_rss_mib, 1),
                 "pss_mib": round(s.host_pss_mib or 0, 1)},
        "health_ms": timeit(prober.health, 50),
        "metrics_fetch_parse_ms": timeit(prober.metrics, 30),
        "metrics_fetch_only_ms": timeit(lambda: http_get(port, "/metrics"), 30),
        "parse_metrics_ms": timeit(lambda: parse_metrics(text), 50),
        "full_prometheus_parse_ms": timeit(lambda: list(full_parse(text)), 10),
        "canary_ms": timeit(prober.canary, 10),
        "tree_walk_ms": timeit(lambda: tree_pids(child), 50),
        "rss_sum_ms": timeit(lambda: host_memory(pids, False), 50),
        "rss_pss_sum_ms": timeit(lambda: host_memory(pids, True), 20),
        "sample_rss_ms": timeit(lambda: sampler.sample(child, False), 30),
        "sample_pss_ms": timeit(lambda: sampler.sample(child, True), 20),
    }


def leg(daemon: psutil.Process, seconds: float, port: int | None) -> dict[str, Any]:
    """CPU and RSS of the daemon pid over `seconds`; load on `port` when given."""
    c0 = daemon.cpu_times()
    t0 = time.monotonic()
    rss: list[float] = []
    load: dict[str, Any] | None = None
    if port is not None:
        import threading

        box: dict[str, Any] = {}
        th = threading.Thread(target=lambda: box.update(
            run_load(port, concurrency=4, requests=None, duration=seconds)), daemon=True)
        th.start()
    marks: list[tuple[float, float]] = []  # (time, cumulative CPU) every 5 s
    while time.monotonic() - t0 < seconds:
        rss.append(daemon.memory_info().rss / 2**20)
        ct = daemon.cpu_times()
        marks.append((time.monotonic(), ct.user + ct.system))
        time.sleep(min(5.0, max(0.0, seconds - (time.monotonic() - t0))))
    if port is not None:
        th.join(timeout=120)
        load = box
    c1 = daemon.cpu_times()
    wall = time.monotonic() - t0
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    marks.append((time.monotonic(), c1.user + c1.system))
    # CPU s/hour in 30 s windows (6 marks apart), for a median/min/max within the leg
    windows = [(marks[i + 6][1] - marks[i][1]) * 3600 / (marks[i + 6][0] - marks[i][0])
               for i in range(0, len(marks) - 6, 6)]
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 3),
            "cpu_s_per_hour_30s_windows": stats(windows, 1),
            "cpu_s_per_hour": round(cpu * 3600 / wall, 1),
            "cpu_percent_of_one_core": round(100 * cpu / wall, 3),
            "rss_mib": stats(rss, 1), "load": load}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--leg-seconds", type=float, default=120.0)
    ap.add_argument("--ab-reps", type=int, default=3)
    ap.add_argument("--ab-requests", type=int, default=200)
    args = ap.parse_args()
    out: dict[str, Any] = {"machine": machine(), "args": vars(args)}
    tmp = Path(tempfile.mkdtemp(prefix="vw-bench-"))
    port, sport, bare_port = free_port(), free_port(), free_port()
    cfg = write_config(tmp / "vw.toml", port, sport, tmp / "cache")
    logdir = RESULTS / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    say("starting vllmwatch + real vLLM on", port)
    w = Watch(cfg, logdir / "overhead-vllmwatch.jsonl")
    bare = None
    try:
        t0 = time.monotonic()
        if w.wait_event("child.ready", t0, 300) is None:
            say("vLLM never READY under vllmwatch; see", logdir)
            return 1
        child = w.child_pid()
        assert child is not None
        daemon = psutil.Process(w.proc.pid)
        time.sleep(5)
        say("poll-cycle pieces")
        out["pieces"] = pieces(port, child)
        legs: dict[str, Any] = {}
        for name, busy in (("default_idle", False), ("default_busy", True)):
            say("leg", name)
            legs[name] = leg(daemon, args.leg_seconds, port if busy else None)
            save("overhead", {**out, "legs": legs})
        write_config(cfg, port, sport, tmp / "cache", sections=FAST)
        t1 = time.monotonic()
        os.kill(w.proc.pid, signal.SIGHUP)
        if w.wait_event("config.reloaded", t1, 30) is None:
            say("reload not confirmed")
        time.sleep(3)
        for name, busy in (("1s_idle", False), ("1s_busy", True)):
            say("leg", name)
            legs[name] = leg(daemon, args.leg_seconds, port if busy else None)
            save("overhead", {**out, "legs": legs})
        out["legs"] = legs
        out["restarts_during_legs"] = len(w.since(t0, "restart.begin"))

        say("A/B: bare vLLM on", bare_port)
        bare = start_bare(bare_port, logdir / "overhead-bare.log")
        if wait_completion(bare_port, 300, every=1.0) is None:
            say("bare vLLM never answered")
            return 1
        time.sleep(5)
        ab: dict[str, list[dict[str, Any]]] = {"bare": [], "supervised_1s": []}
        run_load(bare_port, requests=20)  # warm both
        run_load(port, requests=20)
        for rep in range(args.ab_reps):
            order = [("bare", bare_port), ("supervised_1s", port)]
            if rep % 2:
                order.reverse()
            for name, p in order:
                say("A/B rep", rep, name)
                ab[name].append(run_load(p, concurrency=4, requests=args.ab_requests))
        out["ab"] = {k: {"runs": v,
                         "req_per_s": stats([r["req_per_s"] for r in v]),
                         "lat_p50_ms": stats([r["lat_p50_ms"] for r in v if r["lat_p50_ms"]]),
                         "lat_p95_ms": stats([r["lat_p95_ms"] for r in v if r["lat_p95_ms"]])}
                     for k, v in ab.items()}
        b = out["ab"]["bare"]["req_per_s"].get("median")
        s = out["ab"]["supervised_1s"]["req_per_s"].get("median")
        if b and s:
            out["ab"]["throughput_ratio_supervised_over_bare"] = round(s / b, 3)
        out["machine_after"] = {"loadavg": os.getloadavg()}
        save("overhead", out)
        return 0
    finally:
        if bare is not None:
            kill_group(bare.pid)
        w.stop()
        say("stopped; daemon legs:",
            {k: (v["cpu_s_per_hour"], v["rss_mib"].get("median"))
             for k, v in out.get("legs", {}).items()})


if __name__ == "__main__":
    cleanup_at_exit()
    sys.exit(main())
