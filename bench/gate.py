"""The [gate] front door: its cost when all is well, and failed requests over a restart.

    .venv/bin/python -m bench.gate [--rounds 3] [--runs 3] [--requests 120] [--only cost]

One `vllmwatch run` with gate.enabled on a real CPU vLLM; every figure is measured side by
side in this one run against the same vLLM: "direct" is vLLM's private port, "gate" the
gate's public port.
  throughput  closed loop, 8 clients, --requests completions per round of each length in
              --tokens (16: the worst case, 128: a typical answer; ignore_eos), rounds
              alternate direct/gate; req/s per round, gate/direct ratio of medians
  latency     one client, 40 completions of 1 token: p50 per request
  streaming   one client, 10 streamed completions of 32 tokens: p50 time to first chunk
              and p50 gap between chunks (per streamed token)
  restart     gate.hold_timeout 600 s (restarts took 200-300 s on the loaded box; the
              default 120 s covers a 30-60 s restart); a paced client (4/s, 8 tokens, its
              own timeout 660 s) during a SIGUSR1 restart, --runs times through
              the gate and --runs times direct; counted from SIGUSR1 until vLLM serves again
              plus 5 s
Writes bench/results/gate.json and prints Markdown tables.
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench._common import (
    MODEL,
    PY,
    RESULTS,
    SERVED,
    Watch,
    cleanup_at_exit,
    free_port,
    http_get,
    machine,
    save,
    say,
    write_config,
)
from bench._lb import wait_until
from bench._load import run_load
from vllmwatch.testing.lb import PacedClient, percentiles

HOLD = 600  # gate.hold_timeout here: longer than any restart of the loaded 2-core box


def stream_once(port: int, max_tokens: int = 32) -> tuple[float, float, int]:
    """(time to the first chunk, to the last, number of events) in s, one streamed completion.

    The body goes as bytes: http.client then sends it with the headers in one segment (a
    separate segment waits for a delayed ACK, ~40 ms, which is the client's cost, not ours).
    """
    body = json.dumps({"model": SERVED, "prompt": "The quick brown fox", "temperature": 0,
                       "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    t0 = time.monotonic()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    arrivals: list[float] = []
    seen = 0
    buf = b""
    while chunk := resp.read1(65536):
        buf += chunk
        n = buf.count(b"data: ")
        arrivals += [time.monotonic()] * (n - seen)
        seen = n
    conn.close()
    return arrivals[0] - t0, arrivals[-1] - t0, len(arrivals)


def cost(direct: int, gate: int, rounds: int, requests: int, tokens: list[int], daemon: int,
         concurrency: int = 8) -> dict[str, Any]:
    """Throughput (per completion length), latency and streaming, alternating direct and gate;
    and the daemon's CPU per request through the gate (its CPU in gate rounds less its CPU in
    direct rounds, where it only polls), a figure this noisy box cannot blur much."""
    proc = psutil.Process(daemon)
    tput: dict[str, dict[str, list[float]]] = {}
    ratios: dict[str, float] = {}
    cpu_ms: dict[str, list[float]] = {}
    for n in tokens:
        per: dict[str, list[float]] = {"direct": [], "gate": []}
        for port in (direct, gate):  # warm-up, not counted: first requests are slow
            run_load(port, concurrency=concurrency, requests=requests // 2, max_tokens=n,
                     ignore_eos=True)
        spent = {"direct": 0.0, "gate": 0.0}
        for r in range(rounds):
            for name, port in (("direct", direct), ("gate", gate)):
                before = sum(proc.cpu_times()[:2])
                res = run_load(port, concurrency=concurrency, requests=requests, max_tokens=n,
                               ignore_eos=True)
                spent[name] += sum(proc.cpu_times()[:2]) - before
                say(f"throughput {n} tokens, round {r + 1} {name}: {res}")
                per[name].append(res["req_per_s"])
        cpu_ms[f"{n}_tokens"] = [round(1000 * (spent["gate"] - spent["direct"])
                                       / (rounds * requests), 3)]
        tput[f"{n}_tokens"] = per
        ratios[f"{n}_tokens"] = round(statistics.median(per["gate"])
                                      / statistics.median(per["direct"]), 4)
    lat = {name: run_load(port, concurrency=1, requests=40, max_tokens=1)["lat_p50_ms"]
           for name, port in (("direct", direct), ("gate", gate))}
    stream: dict[str, dict[str, float]] = {}
    for name, port in (("direct", direct), ("gate", gate)):
        runs = [stream_once(port) for _ in range(20)]
        first, last = (statistics.median(r[i] for r in runs) for i in (0, 1))
        stream[name] = {"first_chunk_p50_ms": round(1000 * first, 2),
                        "last_chunk_p50_ms": round(1000 * last, 2),
                        "events": statistics.median(r[2] for r in runs)}
    added = stream["gate"]["last_chunk_p50_ms"] - stream["direct"]["last_chunk_p50_ms"]
    stream["added_per_token_ms"] = {"p50": round(added / max(1, stream["direct"]["events"]), 3)}
    return {"throughput_req_per_s": tput, "gate_over_direct": ratios,
            "gate_cpu_ms_per_request": cpu_ms,
            "latency_p50_ms": lat, "streaming": stream}


def restart(w: Watch, port: int, status_port: int, runs: int) -> list[dict[str, Any]]:
    """Failed requests through `port` over a SIGUSR1 restart, `runs` times."""
    rows = []
    for i in range(runs):
        if not wait_until(lambda: _ready(status_port), 600, 1.0):
            raise RuntimeError("vLLM did not become ready")
        # Waits as long as the gate holds (a start took 200-300 s on the loaded box).
        client = PacedClient(port, SERVED, 4.0, timeout=HOLD + 60)
        client.start()
        time.sleep(3.0)
        t0 = time.monotonic()
        w.proc.send_signal(signal.SIGUSR1)
        done = w.wait_event("restart.done", t0, 600)
        time.sleep(5.0)
        client.stop()
        window = [r for r in client.results if r[0] >= t0]
        failed = [r for r in window if r[2] != "ok"]
        rows.append({"run": i + 1, "requests": len(window), "failed": len(failed),
                     "errors": sorted({r[2] for r in failed}),
                     "downtime_s": done[1].get("downtime_s") if done else None,
                     "latency_ms": percentiles([r[1] for r in window if r[2] == "ok"])})
        say(f"restart run {i + 1} via port {port}: {rows[-1]}")
    return rows


def _ready(status_port: int) -> bool:
    try:
        return bool(http_get(status_port, "/readyz", 1.0)[0] == 200)
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--engine-latency", type=float, metavar="S",
                    help="GPU-shaped: supervise the fake vLLM, whose batching engine answers "
                         "every completion S s after it arrives and spends no host CPU on it "
                         "(the model's time is on the GPU); the real CPU vLLM otherwise")
    ap.add_argument("--concurrency", type=int, default=8, help="closed-loop clients")
    ap.add_argument("--tokens", default="16,128",
                    help="completion lengths of the throughput part (ignore_eos), comma list")
    ap.add_argument("--runs-direct", type=int, help="restarts without the gate (default --runs)")
    ap.add_argument("--only", choices=("cost", "restart"), help="one part only")
    args = ap.parse_args()
    out: dict[str, Any] = {"machine": machine()}
    with tempfile.TemporaryDirectory(prefix="vw-gate-") as t:
        tmp = Path(t)
        port, gate_port, status_port = free_port(), free_port(), free_port()
        fake = args.engine_latency is not None
        cfg = write_config(tmp / "vw.toml", port, status_port, tmp / "cache", command=[
            PY, "-m", "vllmwatch.testing.fake_vllm", "--slow-completion",
            str(args.engine_latency), "--disable-uvicorn-access-log"] if fake else None,
            model="tiny-fake" if fake else MODEL, sections={
            "gate": {"enabled": True, "listen": f"127.0.0.1:{gate_port}",
                     "hold_timeout": f"{HOLD}s"},
            "drain": {"deregister_delay": "0s"},
            "restart": {"stable_after": "20s", "max_restarts": 50},
            "prewarm": {"enabled": False}})
        name = f"gate-{args.only or 'all'}{'-fake' if fake else ''}"
        w = Watch(cfg, RESULTS / "logs" / f"{name}-vllmwatch.jsonl")
        try:
            if not wait_until(lambda: _ready(status_port), 600, 1.0):
                raise RuntimeError("vLLM did not become ready")
            if args.only != "restart":
                out["cost"] = cost(port, gate_port, args.rounds, args.requests,
                                   [int(n) for n in args.tokens.split(",")], w.proc.pid,
                                   args.concurrency)
                out["cost"]["engine"] = (f"fake, {args.engine_latency:g} s per completion"
                                         if fake else "real CPU vLLM, tiny model")
            if args.only != "cost":
                out["restart_gate"] = restart(w, gate_port, status_port, args.runs)
                out["restart_direct"] = restart(w, port, status_port,
                                                args.runs_direct or args.runs)
        finally:
            w.stop()
    save(name.replace("gate-all", "gate"), out)
    print(json.dumps({k: v for k, v in out.items() if k != "machine"}, indent=1))
    return 0


if __name__ == "__main__":
    cleanup_at_exit()
    sys.exit(main())
