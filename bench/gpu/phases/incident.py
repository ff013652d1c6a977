"""Issue 25's phase: the incident record of a hung engine on the 8B-shaped model.

  incident  one daemon, records under its own STATE_DIRECTORY: EngineCore SIGSTOP (hang)
            -> which stack methods ran, each process's dumps, EngineCore's innermost vLLM
            frames, how long the record delayed the SIGTERM; the record is copied to
            $OUT/incident/. py-spy comes from the payload's vllmwatch-bin/ (vllm_h200.sh
            keeps it there); without it only faulthandler runs, which a stopped EngineCore
            cannot answer, and the record says so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

from bench.gpu.config import big_config
from bench.gpu.daemon import GpuDaemon
from bench.gpu.inject import inject_fault, serving
from bench.gpu.models import ensure_big
from bench.gpu.procs import find_titled
from bench.gpu.run import Run


def summary(path: Path) -> dict[str, Any]:
    """What a record says in a few fields (methods, per process the dumps, the main
    threads' innermost vLLM frames, the record's own time)."""
    rec = json.loads((path / "record.json").read_text())
    procs = []
    for proc in rec["stacks"]["processes"]:
        dumps = {d["method"]: [d["ok"], d["error"][:160]] for d in proc["dumps"]}
        frames = [f"{f[0]} ({f[1]}:{f[2]})" for d in proc["dumps"] if d["ok"]
                  for t in d["threads"][:1] for f in t["frames"] if "vllm/" in str(f[1])]
        procs.append({"pid": proc["pid"], "role": proc["role"], "dumps": dumps,
                      "main_thread_vllm_frames": frames[:6]})
    return {"id": rec["id"], "reason": rec["reason"], "methods": rec["stacks"]["methods"],
            "processes": procs, "tree_note": rec["tree"]["note"],
            "record_s": rec["capture"]["seconds"], "versions": rec["versions"],
            "output_lines": len(rec["output"]),
            "metrics_series": len(rec["metrics"].get("last") or {})}


def incident(run: Run) -> None:
    ensure_big(run)
    state = run.work / "state-incident"
    shutil.rmtree(state, ignore_errors=True)
    spy = run.work / "site" / "vllmwatch-bin"
    env = {"STATE_DIRECTORY": str(state), "PATH": f"{spy}:{os.environ.get('PATH', '')}"}
    port = run.port(13)
    conf = big_config(run, "incident", port, run.status_port(13), run.work / "cache8b")
    run.emit("incident", "start", gpu=run.wait_idle_gpu(),
             py_spy=shutil.which("py-spy", path=env["PATH"]))
    d = GpuDaemon(run, "incident", conf, "incident-vllmwatch.log", env=env)
    try:
        if not serving(d, "ready", port, "q8b"):
            return
        run.pause(8)  # a few /metrics scrapes for the record
        mark = d.count()
        inject_fault(d, "engine_sigstop", port, "q8b",
                     find_titled("VLLM::EngineCore", d.pid), signal.SIGSTOP)
        report(run, d, mark)
    finally:
        d.stop_and_check()


def report(run: Run, d: GpuDaemon, mark: int) -> None:
    """The record of the fault after `mark`: copied to $OUT/incident/, summarised."""
    recs, begins = d.named("incident.recorded", mark), d.named("restart.begin", mark)
    stops = d.named("child.stopping", mark)
    if not recs:
        run.emit("incident", "no_record", failed=d.named("incident.failed", mark),
                 timeout=d.named("incident.timeout", mark))
        return
    path = Path(recs[0]["incident_path"])
    dest = run.out / "incident" / path.name
    shutil.copytree(path, dest, dirs_exist_ok=True)
    t_begin = float(begins[0]["t"]) if begins else None
    run.emit("incident", "record", copied_to=str(dest), stacks=recs[0].get("stacks"),
             restart_to_record_s=None if t_begin is None
             else round(float(recs[0]["t"]) - t_begin, 3),
             restart_to_sigterm_s=None if t_begin is None or not stops
             else round(float(stops[0]["t"]) - t_begin, 3), **summary(path))
