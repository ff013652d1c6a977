#!/usr/bin/env python3
"""The real vllmwatch daemon supervising a GPU-leaking process tree, on a real NVIDIA GPU.

    PYTHONPATH=$PWD python3 bench/gpu/daemon_leak.py --gpus 0 [--port 8011] \\
        > docs/gpu/gpu-daemon-1gpu.jsonl

The child is `leak_tree.py serve` (an API server whose grandchildren allocate with torch in
512 MiB steps, like EngineCore or TP workers). vllmwatch samples NVML per process over the
tree, its gpu_growth_limit rule fires, it restarts the child, and the GPU release gate waits
until NVML no longer lists the old pids. The script prints JSON lines: a header (date, driver,
GPUs), the daemon's events that matter, and a summary with the timings; exit 0 when the
whole cycle (READY -> gpu_memory restart -> released -> READY) happened and nothing is left.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vllmwatch.shell.memory import make_sampler
from vllmwatch.testing.daemon import Daemon, Event
from vllmwatch.testing.daemonenv import REPO
from vllmwatch.testing.waiting import holds_within

KEEP = ("daemon.", "child.started", "child.ready", "child.exited", "restart.", "memory.",
        "gpu.", "state.changed", "leftovers.", "crashloop.")


def emit(kind: str, **fields: Any) -> None:
    print(json.dumps({"kind": kind, **fields}, default=str), flush=True)


def config_text(a: argparse.Namespace) -> str:
    gpus = ", ".join(a.gpus.split(","))
    return f"""
[vllm]
command = ["{sys.executable}", "{REPO}/bench/gpu/leak_tree.py", "serve"]
model = "leak-tree"
port = {a.port}
gpus = [{gpus}]
[vllm.args]
step-mib = {a.step_mib}
every = {a.every}
leak-after = {a.leak_after}
max-mib = {a.max_mib}
[probe]
interval = "1s"
canary_interval = "5s"
[memory]
sample_interval = "1s"
pss_interval = "5s"
baseline_delay = "2s"
gpu_growth_limit = "{a.growth_limit_mib}MiB"
sustain = 3
[restart]
drain_timeout = "0s"
stop_timeout = "10s"
backoff_initial = "1s"
gpu_release_timeout = "60s"
[prewarm]
enabled = false
[status]
listen = ""
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", default="0")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--step-mib", type=int, default=512)
    p.add_argument("--every", type=float, default=2.0)
    p.add_argument("--leak-after", type=float, default=8.0)
    p.add_argument("--max-mib", type=int, default=4096)
    p.add_argument("--growth-limit-mib", type=int, default=1536)
    p.add_argument("--limit", type=float, default=240.0, help="seconds for the whole cycle")
    a = p.parse_args()
    sampler = make_sampler([int(g) for g in a.gpus.split(",")], lambda *x, **k: None)
    emit("header", date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
         requested_gpus=a.gpus, device_used_mib_before=sampler.device_used_mib(),
         **sampler.describe())
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "gpu.toml"
        conf.write_text(config_text(a))
        return run(a, conf, sampler)


def run(a: argparse.Namespace, conf: Path, sampler: Any) -> int:
    """The daemon (the shared harness) until READY again after the leak restart, or limit."""
    marks: dict[str, float] = {}
    t0 = time.monotonic()

    def line(now: float, text: str, ev: Event | None) -> None:
        if ev is None:
            print(text, file=sys.stderr)  # not an event: a traceback, say
            return
        name = str(ev.get("event", ""))
        if name.startswith(KEEP):
            emit("daemon", **ev, t=round(now - t0, 2))
        note(marks, name, ev, now - t0)

    d = Daemon(conf.parent, conf, notify=False, on_line=line).start()
    try:
        holds_within(lambda: "ready_again" in marks or d.exited(), a.limit)
    finally:
        code, _ = d.stop(60)
    left = [p.pid for p in d.leftovers()]
    after = sampler.device_used_mib()
    ok = {"gpu_memory_restart", "released", "ready_again"} <= marks.keys() and not left
    emit("summary", ok=ok, daemon_exit=code, marks_s=marks, leftover_pids=left,
         device_used_mib_after=after, processes_on_gpu_after=[
             (p.pid, p.gpu_index, p.used_mib) for p in (sampler.gpu_processes() or [])])
    return 0 if ok and code == 0 else 1


def note(marks: dict[str, float], name: str, ev: dict[str, Any], t: float) -> None:
    if name == "child.ready":
        marks["ready_again" if "ready" in marks else "ready"] = round(t, 2)
    elif name == "memory.rule_fired":
        marks.setdefault("rule_fired", round(t, 2))
    elif name == "restart.begin" and ev.get("reason") == "gpu_memory":
        marks["gpu_memory_restart"] = round(t, 2)
    elif name in ("gpu.released", "gpu.release_timeout"):
        marks["released" if name == "gpu.released" else "release_timeout"] = round(t, 2)


if __name__ == "__main__":
    raise SystemExit(main())
