"""The gate's latency at steady state (no fault) with [gate] replay on and off (issue 35).

    .venv/bin/python -m bench.gate_replay [--runs 3] [--requests 300]

One fake vLLM (vllmwatch.testing.fake_vllm) and one Gate in this process in front of it; one
client sends --requests completions (and a tenth as many streamed ones: time to the first
chunk) back to back through the gate, in runs that alternate replay on / off (the order swapped
each round), --runs each.
The fake answers in about a millisecond, so what is measured is mostly the gate itself.
Prints one JSON object: per setting, each run's p50/p99 in ms and the spread over the runs.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

from vllmwatch.gate.door import Readiness
from vllmwatch.gate.runner import Gate
from vllmwatch.testing.ports import free_port

BODY = json.dumps({"model": "fake", "prompt": "hello there", "max_tokens": 4})
STREAM = json.dumps({"model": "fake", "prompt": "hello there", "max_tokens": 4, "stream": True})


def one(conn: http.client.HTTPConnection, body: str, first_chunk: bool) -> float:
    """Seconds to the whole answer (or to the first streamed chunk)."""
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if first_chunk:
        resp.read1(65536)
        took = time.perf_counter() - t0
        resp.read()
        return took
    resp.read()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}")
    return time.perf_counter() - t0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def run(port: int, requests: int) -> dict[str, float]:
    """One run: p50/p99 of whole answers and p50 of the first streamed chunk, in ms."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for _ in range(20):  # warm-up: connections, the fake's threads
            one(conn, BODY, False)
        whole = [one(conn, BODY, False) for _ in range(requests)]
        first = []
        for _ in range(max(10, requests // 10)):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            first.append(one(c, STREAM, True))
            c.close()
    finally:
        conn.close()
    return {"p50_ms": round(pct(whole, 0.5), 3), "p99_ms": round(pct(whole, 0.99), 3),
            "stream_first_p50_ms": round(pct(first, 0.5), 3)}


def main() -> int:
    """Parse the flags, run the alternating runs, print the results."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--requests", type=int, default=300)
    a = p.parse_args()
    upstream = free_port()
    fake = subprocess.Popen([sys.executable, "-m", "vllmwatch.testing.fake_vllm", "--port",
                             str(upstream), "--model", "fake", "--stream-interval", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    gate = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{upstream}",
                lambda: Readiness.OPEN, 30, 1, generation=lambda: 1)
    results: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                http.client.HTTPConnection("127.0.0.1", upstream, timeout=1).request("GET",
                                                                                    "/health")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        time.sleep(1.0)  # the fake's engine is up
        gate.start()
        for i in range(a.runs):
            # The order swaps each round (on/off, off/on, ...): a warm-up or a neighbour's
            # load that favours whichever runs second falls on both settings alike.
            for setting in (("on", "off") if i % 2 == 0 else ("off", "on")):
                gate.forwarder.replay = setting == "on"
                results[setting].append(run(gate.port, a.requests))
    finally:
        gate.stop()
        os.killpg(fake.pid, signal.SIGKILL)
        fake.wait(10)
    out: dict[str, Any] = {"runs": a.runs, "requests": a.requests, "loop": gate.loop,
                           "order": "on/off, then off/on, alternating by round"}
    for setting, rows in results.items():
        summary = {}
        for key in rows[0]:
            vals = [r[key] for r in rows]
            summary[key] = {"median": round(statistics.median(vals), 3),
                            "min": min(vals), "max": max(vals)}
        out[setting] = {"runs": rows, "summary": summary}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
