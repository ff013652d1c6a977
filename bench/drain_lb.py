"""Planned restarts behind a real load balancer: failed requests with and without the drain.

    .venv/bin/python -m bench.drain_lb [--runs 3] [--hows sigusr1,leak] [--delays 10,0]
        [--rate 4]

HAProxy (Debian package) in front of two vllmwatch + real CPU vLLM instances on loopback,
health-checking each vllmwatch's /readyz (`inter 1s fall 2 rise 1`). A client sends `rate`
completions per second (max_tokens 8, each on a new connection) through HAProxy while
instance `a` gets a planned restart: SIGUSR1, or a host-memory leak injected into its vLLM
API server (bench/leakhook, as bench/recovery.py) that trips memory.host_limit. Each
drain.deregister_delay in --delays is set by rewriting a's config and SIGHUP (no relaunch);
0 is the behaviour before the deregistration delay existed. Counted: requests the client
started from the injection until `a` serves again plus 5 s; failed = any non-200 or error.
Writes bench/results/drain_lb.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import RESULTS, Watch, cleanup_at_exit, machine, save, say
from bench._lb import Instance, balancer, haproxy_path, make_instances, planned_restart, wait_until


def set_delay(a: Instance, tmp: Path, delay: float) -> None:
    """Rewrite a's config with this deregistration delay and reload it (SIGHUP)."""
    assert a.watch is not None
    a.write(tmp, delay)
    t0 = time.monotonic()
    a.watch.proc.send_signal(1)  # SIGHUP
    if a.watch.wait_event("config.reloaded", t0, 30) is None:
        raise RuntimeError("instance a did not reload its config")


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of docs/BENCHMARKS.md."""
    out = ["| deregister_delay | restart | run | requests | failed | errors | p50 ms | p95 ms "
           "| max ms | a down s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lat = r["latency_ms"]
        out.append(f"| {r['delay']:g} s | {r['how']} | {r['run']} | {r['requests']} | "
                   f"{r['failed']} | {r['errors'] or '-'} | {lat['p50']} | {lat['p95']} | "
                   f"{lat['max']} | {r['downtime_s']} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hows", default="sigusr1,leak")
    ap.add_argument("--delays", default="10,0")
    ap.add_argument("--rate", type=float, default=4.0)
    args = ap.parse_args()
    binary = haproxy_path()
    if binary is None:
        print("[bench] haproxy not found: install it (apt-get install -y haproxy)")
        return 2
    delays = [float(d) for d in args.delays.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="vw-drainlb-") as t:
        tmp = Path(t)
        trigger = tmp / "leak-trigger"
        insts = make_instances(tmp, delays[0], trigger)
        for inst in insts:
            inst.watch = Watch(inst.config, RESULTS / "logs" / f"drain_lb-{inst.name}.jsonl")
        lb = balancer(binary, tmp, insts)
        try:
            if not wait_until(lambda: all(i.ready() for i in insts), 600, 1.0):
                raise RuntimeError("the two instances did not become ready")
            for delay in delays:
                set_delay(insts[0], tmp, delay)
                for how in args.hows.split(","):
                    for run in range(1, args.runs + 1):
                        say(f"deregister_delay={delay:g}s {how} run {run}")
                        r = planned_restart(lb, insts[0], how, trigger, args.rate)
                        rows.append({"delay": delay, "run": run, **r})
                        save("drain_lb", {"machine": machine(), "rate": args.rate,
                                          "rows": rows})  # after each run: partial results
                        say(f"  {r['requests']} requests, {r['failed']} failed {r['errors']}, "
                            f"latency {r['latency_ms']}")
        finally:
            lb.stop()
            for inst in insts:
                if inst.watch is not None:
                    inst.watch.stop()
    save("drain_lb", {"machine": machine(), "rate": args.rate, "rows": rows})
    print(table(rows))
    return 0


if __name__ == "__main__":
    cleanup_at_exit()
    sys.exit(main())
