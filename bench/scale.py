"""Scale: how the poll-cycle pieces grow with /metrics size, tree size and GPU count.

    .venv/bin/python -m bench.scale

1. /metrics size: synthetic bodies of ~50 KB .. 5 MB (real vLLM series names and labels,
   many label sets). Two shapes: "other" (growth in series vllmwatch does not read, e.g.
   histograms per model/LoRA: the filter drops them) and "wanted" (growth in the series it
   reads: every line survives the filter; the worst case). Timed: parse_metrics (filter +
   parse), the full prometheus parse for reference, and HttpProber.metrics() fetching the
   body from a loopback HTTP server (fetch + parse).
2. Process tree: a shell with N sleeping children (N = 4 .. 1024): tree walk, RSS sum,
   RSS+PSS sum (smaps_rollup), the sampler's RSS sample.
3. GPUs: vllmwatch.testing.fake_nvml.FakeNvml with 1..8 GPUs, each listing P compute processes
   (P = 8, 64); the NVML sampling path of NvmlSampler.sample() with no tree (the Python cost
   of our code; a real NVML adds its call latency, see docs/BENCHMARKS.md).
Writes bench/results/scale.json.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families as full_parse

from bench._common import (
    cleanup_at_exit,
    free_port,
    kill_group,
    machine,
    save,
    say,
    timeit,
    track_group,
)
from vllmwatch.config.schema import ProbeConfig
from vllmwatch.shell.memory import host_memory, make_sampler, tree_pids
from vllmwatch.shell.probes import Endpoint, HttpProber, parse_metrics
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml

SIZES_KB = (50, 200, 1000, 5000)
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
          "vllm:kv_cache_usage_perc")
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
BUCKETS = ("0.001", "0.005", "0.01", "0.05", "0.1", "0.5", "1.0", "5.0", "10.0", "+Inf")


def body(target_kb: int, shape: str) -> str:
    """A Prometheus text body of about target_kb KB."""
    out: list[str] = []
    i = 0
    hist_head = ("# HELP vllm:e2e_request_latency_seconds x\n"
                 "# TYPE vllm:e2e_request_latency_seconds histogram\n")
    size = 400
    while size < target_kb * 1000 and i < 10_000_000:
        labels = f'engine="{i % 8}",model_name="/models/lora-{i:06d}"'
        if shape == "wanted" or i < 8:
            lines = [f"{n}{{{labels}}} {i % 7}.0\n" for n in (*GAUGES, *COUNTERS)]
        else:
            lines = [f'vllm:e2e_request_latency_seconds_bucket{{{labels},le="{b}"}} {i}.0\n'
                     for b in BUCKETS]
        out += lines
        size += sum(len(x) for x in lines)
        i += 1
    # group each family's samples together, as exposition requires
    by_name: dict[str, list[str]] = {}
    for line in out:
        by_name.setdefault(line.split("{", 1)[0], []).append(line)
    parts = []
    for n in (*GAUGES, *COUNTERS):
        parts.append(f"# HELP {n} x\n# TYPE {n} {'gauge' if n in GAUGES else 'counter'}\n")
        parts += by_name.get(n, [])
    if any(k.startswith("vllm:e2e") for k in by_name):
        parts.append(hist_head)
        parts += by_name["vllm:e2e_request_latency_seconds_bucket"]
    return "".join(parts)


def metrics_scale() -> list[dict[str, Any]]:
    rows = []
    holder: dict[str, bytes] = {"body": b""}

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            b = holder["body"]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)

        def log_message(self, *a: Any) -> None:
            pass

    port = free_port()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    prober = HttpProber(Endpoint("127.0.0.1", port, "m"),
                        ProbeConfig(timeout=30.0, canary_timeout=30.0))
    try:
        for shape in ("other", "wanted"):
            for kb in SIZES_KB:
                text = body(kb, shape)
                holder["body"] = text.encode()
                n = 20 if kb <= 1000 else 5
                row: dict[str, Any] = {"shape": shape, "kb": round(len(text) / 1000),
                       "lines": text.count("\n"),
                       "parse_metrics_ms": timeit(lambda t=text: parse_metrics(t), n),
                       "fetch_parse_ms": timeit(prober.metrics, n)}
                if kb <= 1000 or shape == "other":
                    row["full_parse_ms"] = timeit(lambda t=text: list(full_parse(t)), 3)
                vals = parse_metrics(text)
                row["parsed_running"] = vals.get("vllm:num_requests_running")
                say("metrics", shape, row["kb"], "KB:", row["parse_metrics_ms"]["median"], "ms")
                rows.append(row)
    finally:
        srv.shutdown()
        srv.server_close()
    return rows


def tree_scale() -> list[dict[str, Any]]:
    rows = []
    sampler = make_sampler([], lambda *a, **k: None)
    for n in (4, 16, 64, 256, 1024):
        p = subprocess.Popen(
            ["bash", "-c", f"for i in $(seq {n}); do sleep 300 & done; wait"],
            start_new_session=True, stdin=subprocess.DEVNULL)
        track_group(p.pid)
        try:
            deadline = time.monotonic() + 60
            while len(tree_pids(p.pid)) < n + 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            pids = tree_pids(p.pid)
            reps = 20 if n <= 256 else 5
            row: dict[str, Any] = {"processes": len(pids),
                   "tree_walk_ms": timeit(lambda r=p.pid: tree_pids(r), reps),
                   "rss_sum_ms": timeit(lambda x=pids: host_memory(x, False), reps),
                   "rss_pss_sum_ms": timeit(lambda x=pids: host_memory(x, True),
                                            max(3, reps // 4)),
                   "sample_rss_ms": timeit(lambda r=p.pid: sampler.sample(r, False), reps)}
            say("tree", row["processes"], "procs: walk", row["tree_walk_ms"]["median"],
                "ms, pss", row["rss_pss_sum_ms"]["median"], "ms")
            rows.append(row)
        finally:
            kill_group(p.pid, 5)
    return rows


def gpu_scale() -> list[dict[str, Any]]:
    rows = []
    base = 4_000_000
    for per_gpu in (8, 64):
        for g in (1, 2, 4, 8):
            gpus = [FakeGpu(used_mib=1000.0 * (i + 1),
                            procs={base + i * 1000 + k: 512.0 for k in range(per_gpu)})
                    for i in range(g)]
            nvml = FakeNvml(gpus)
            sampler = make_sampler(None, lambda *a, **k: None, nvml=nvml)

            def one(nv: FakeNvml = nvml, s: Any = sampler) -> None:
                nv.calls.clear()
                s.sample(None, False)

            t = timeit(one, 200)
            calls = len(nvml.calls)
            t_tree = timeit(lambda s=sampler: s.sample(os.getpid(), False), 50)
            row = {"gpus": g, "procs_per_gpu": per_gpu, "nvml_calls_per_sample": calls,
                   "sample_nvml_only_ms": t, "sample_with_own_tree_ms": t_tree}
            say("gpus", g, "x", per_gpu, "procs:", t["median"], "ms,", calls, "calls")
            rows.append(row)
    return rows


def main() -> int:
    out: dict[str, Any] = {"machine": machine()}
    out["metrics"] = metrics_scale()
    save("scale", out)
    out["tree"] = tree_scale()
    save("scale", out)
    out["gpus"] = gpu_scale()
    out["machine_after"] = {"loadavg": os.getloadavg()}
    save("scale", out)
    return 0


if __name__ == "__main__":
    cleanup_at_exit()
    sys.exit(main())
