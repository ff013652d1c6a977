"""A SIGUSR1 restart of the real CPU vLLM with and without the standby interpreter (issue 28).

    .venv/bin/python -m bench.standby [--runs plain,fork,standby] [--timeout 600]

One vllmwatch per run on the tiny model (scripts/make_tiny_model.py), shipped defaults except
`prewarm.enabled = false` (it runs before the first start only) and the run's own settings:
  plain         restart.standby = false, VLLM_WORKER_MULTIPROC_METHOD=spawn (what vllmwatch
                launched before issue 28: vLLM's own choice)
  fork          restart.standby = false (EngineCore by fork: vllmwatch's default for one
                worker since issue 28)
  standby       restart.standby = true (a CPU config: auto would say off) and fork
Nothing polls /readyz here, so the planned restart skips drain.deregister_delay in all runs.
Each run: start, wait for READY (and, with the standby, for its imports to finish), then
SIGUSR1 and time restart.begin -> child.started -> child.ready from vllmwatch's own events.
Writes bench/results/standby.json, vllmwatch's logs to bench/results/logs/standby-RUN.log.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import (
    MODEL,
    RESULTS,
    Watch,
    cleanup_at_exit,
    free_port,
    machine,
    save,
    say,
    write_config,
)

RUNS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "plain": ({"standby": False}, {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}),
    "fork": ({"standby": False}, {}),
    "standby": ({"standby": True}, {}),
}


def one(name: str, workdir: Path, timeout: float) -> dict[str, Any]:
    """One run: READY, then a SIGUSR1 restart, timed from vllmwatch's events."""
    restart, env = RUNS[name]
    port, status = free_port(), free_port()
    config = write_config(workdir / name / "vllmwatch.toml", port, status, workdir / "cache",
                          sections={"restart": restart, "prewarm": {"enabled": False}},
                          env=env)
    watch = Watch(config, RESULTS / "logs" / f"standby-{name}.log")
    out: dict[str, Any] = {"run": name}
    try:
        t0 = time.monotonic()
        ready = watch.wait_event("child.ready", t0, timeout)
        if ready is None:
            return {**out, "error": "never READY"}
        out["cold_ready_s"] = round(ready[0] - t0, 2)
        if restart["standby"]:
            waiting = watch.wait_event("standby.waiting", t0, timeout)
            if waiting is None:
                return {**out, "error": "no standby.waiting"}
            out["standby"] = {k: waiting[1].get(k) for k in ("rss_mib", "import_s",
                                                             "failed_imports")}
        t1 = time.monotonic()
        watch.proc.send_signal(signal.SIGUSR1)
        begin = watch.wait_event("restart.begin", t1, 60)
        started = watch.wait_event("child.started", t1, 120)
        again = watch.wait_event("child.ready", t1, timeout)
        if begin is None or started is None or again is None:
            return {**out, "error": "the restart did not reach READY"}
        out.update(launch=started[1].get("launch"),
                   begin_to_launch_s=round(started[0] - begin[0], 2),
                   launch_to_ready_s=round(again[0] - started[0], 2),
                   begin_to_ready_s=round(again[0] - begin[0], 2))
    finally:
        out["exit_code"] = watch.stop()
    say(name, out)
    return out


def main() -> int:
    """Run the chosen runs one after the other and save what they measured."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", default="plain,fork,standby")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    cleanup_at_exit()
    if not Path(MODEL, "config.json").exists():
        say(f"no model at {MODEL}: run scripts/make_tiny_model.py {MODEL} first")
        return 2
    results: dict[str, Any] = {"machine": machine(), "runs": {}}
    with tempfile.TemporaryDirectory(prefix="bench-standby-") as tmp:
        for name in args.runs.split(","):
            results["runs"][name] = one(name, Path(tmp), args.timeout)
    runs = results["runs"]
    without = runs.get("plain", {}).get("begin_to_ready_s")
    for name in ("fork", "standby"):
        got = runs.get(name, {}).get("begin_to_ready_s")
        if got and without:
            results[f"ratio_{name}_vs_plain"] = round(got / without, 2)
    fork, got = runs.get("fork", {}).get("begin_to_ready_s"), runs.get("standby", {}).get(
        "begin_to_ready_s")
    if fork and got:
        results["ratio_standby_vs_fork"] = round(got / fork, 2)
    save("standby", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
