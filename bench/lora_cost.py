"""What `--enable-lora` costs the base model on the real CPU vLLM (issue 38).

    .venv/bin/python -m bench.lora_cost [--rounds 3] [--seconds 20] [--timeout 600]

Bare `vllm serve` of the tiny model (no vllmwatch: the flag's own cost), alternating off and
on, `rounds` times each: off is the plain line, on adds `--enable-lora --max-loras 1
--max-lora-rank 8 --lora-modules a1=<a tiny rank-8 adapter>` (tests/support/tinylora.py).
Each run: time to the first answered completion, then the tree's RSS and USS (sum over the
API server, EngineCore and workers), then `seconds` of 4 clients asking the BASE model
(max_tokens 32, ignore_eos) back to back: completions and generated tokens per second.
Writes bench/results/lora_cost.json and the vLLM logs to bench/results/logs/lora_cost-*.log.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench._common import (
    RESULTS,
    cleanup_at_exit,
    completion,
    free_port,
    kill_group,
    machine,
    save,
    say,
    track_group,
    tree,
    vllm_argv,
    vllm_env,
    wait_completion,
)
from tests.support.tinylora import make

CLIENTS, TOKENS = 4, 32


def memory(pid: int) -> dict[str, float]:
    rss = uss = 0.0
    for p in tree(pid):
        with contextlib.suppress(psutil.Error):
            info = p.memory_full_info()
            rss += info.rss / 2**20
            uss += info.uss / 2**20
    return {"rss_mib": round(rss, 1), "uss_mib": round(uss, 1)}


def throughput(port: int, seconds: float) -> dict[str, float]:
    done, stop, lock = [0], threading.Event(), threading.Lock()

    def client() -> None:
        while not stop.is_set():
            if completion(port, timeout=120, max_tokens=TOKENS, ignore_eos=True):
                with lock:
                    done[0] += 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(180)
    took = time.monotonic() - t0
    return {"completions_per_s": round(done[0] / took, 3),
            "tokens_per_s": round(done[0] * TOKENS / took, 1)}


def one(mode: str, adapter: Path, seconds: float, timeout: float, n: int) -> dict[str, Any]:
    port = free_port()
    argv = vllm_argv(port)
    if mode == "on":
        argv += ["--enable-lora", "--max-loras", "1", "--max-lora-rank", "8",
                 "--lora-modules", f"a1={adapter}"]
    log = RESULTS / "logs" / f"lora_cost-{mode}-{n}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as f:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True, env=vllm_env({"TMPDIR": "/tmp"}))
    track_group(p.pid)
    t0 = time.monotonic()
    try:
        up = wait_completion(port, timeout)
        if up is None:
            return {"mode": mode, "error": "no answer within the timeout"}
        out: dict[str, Any] = {"mode": mode, "ready_s": round(up - t0, 1), **memory(p.pid)}
        out.update(throughput(port, seconds))
        out["after"] = memory(p.pid)
        return out
    finally:
        kill_group(p.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--timeout", type=float, default=600.0)
    a = ap.parse_args()
    adapter = make(Path(tempfile.mkdtemp(prefix="lora-cost-")) / "a1", 8, 1)
    runs = []
    for n in range(a.rounds):
        for mode in ("off", "on"):
            run = one(mode, adapter, a.seconds, a.timeout, n)
            say(run)
            runs.append(run)
    summary = {}
    for mode in ("off", "on"):
        ok = [r for r in runs if r["mode"] == mode and "error" not in r]
        summary[mode] = {k: round(statistics.median(r[k] for r in ok), 2) for k in (
            "ready_s", "rss_mib", "uss_mib", "completions_per_s", "tokens_per_s")} if ok else {}
    save("lora_cost", {"machine": machine(), "clients": CLIENTS, "max_tokens": TOKENS,
                       "seconds": a.seconds, "runs": runs, "median": summary})
    say(summary)
    return 0


if __name__ == "__main__":
    cleanup_at_exit()
    raise SystemExit(main())
