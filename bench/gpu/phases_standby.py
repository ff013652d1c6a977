"""Phases for issue 28 on the H200 (8B shape), registered into drive.PHASES.

  standby      cold start (empty compile cache: the reference), then EngineCore kill -9,
               API server SIGKILL, a GPU leak (gpuleak/sitecustomize.py, 1 GiB/s) and SIGUSR1,
               each with the standby on (`restart.standby` at its default, auto); before each
               fault the standby has finished its imports
  standbyoff   the same faults with `restart.standby = false` (warm cache from `standby`)
  standbyapi2  `api-server-count = 2`, standby on: EngineCore kill -9, then SIGUSR1

Shipped defaults except the leak rule's size (memory.gpu_growth_limit 4 GiB, its baseline
after 5 s) and the status listener. Every fault emits `restart_timing`: restart.begin ->
child.started (and how: standby or fresh) -> child.ready, the same from the fault, the
standby's state, RSS and import time before it, processes of the old tree still alive
(the standby that took the launch is not counted), and vllmwatch's gpu_tree_mib next to
NVML's. Every stop: nothing of the tree or a standby left, GPUs idle.

Dry run with the fake vLLM (no GPU; leak skipped): bench/gpu/dry_standby.sh.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import drive as D  # the running driver module (drive.py registers itself under this name)
import phases_gpu as G

PORT, STATUS = 8120, 9130
DRY = os.environ.get("VLLMWATCH_STANDBY_DRY") == "1"  # the fake vLLM: force the standby on
STANDBY_WAIT = 120.0  # for the standby's imports (~19 s on the H200)


def config(name: str, standby: str, cache: Path, args: dict[str, Any] | None = None) -> Path:
    """vllmwatch's shipped defaults for the 8B shape, the leak rule and `standby`."""
    env = {"PYTHONPATH": str(G.HOOK_DIR), "VLLMWATCH_GPU_LEAK_TRIGGER": str(G.LEAK_TRIGGER),
           "VLLMWATCH_GPU_LEAK_MIB": "1024", "VLLMWATCH_GPU_LEAK_STEPS": "8"}
    venv = "\n".join(f'{k} = "{v}"' for k, v in env.items())
    vargs = {"max-model-len": 8192, "gpu-memory-utilization": 0.90, "dtype": "bfloat16",
             **(args or {})}
    text = f'''# {name}: written by bench/gpu/phases_standby.py
[vllm]
command = ["{D.VLLM}", "serve"]
model = "{D.BIG}"
served_model_name = "q8b"
port = {PORT}
gpus = [0]
[vllm.env]
HF_HUB_OFFLINE = "1"
VLLM_NO_USAGE_STATS = "1"
VLLM_USE_FLASHINFER_SAMPLER = "0"
{venv}
[vllm.args]
{chr(10).join(f"{k} = {_toml(v)}" for k, v in vargs.items())}
[memory]
gpu_growth_limit = "4GiB"
baseline_delay = "5s"
[restart]
standby = {"true" if DRY and standby == '"auto"' else standby}
[prewarm]
cache_dir = "{cache}"
[status]
listen = "127.0.0.1:{STATUS}"
[log]
format = "json"
'''
    path = D.WORK / f"{name}.toml"
    path.write_text(text)
    return path


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, (int, float)) else f'"{value}"'


def standby_ready(d: D.Daemon) -> dict[str, Any]:
    """Wait (bounded) until /status says the standby finished its imports, or is off."""
    t0 = time.monotonic()
    deadline = t0 + min(STANDBY_WAIT, max(10.0, D.left() - 60))
    snap: dict[str, Any] = {}
    while time.monotonic() < deadline:
        code, body = D.http("GET", f"http://127.0.0.1:{STATUS}/status")
        with contextlib.suppress(ValueError, TypeError):
            snap = json.loads(body) if code == 200 else snap
        if snap.get("standby_state") in ("waiting", "off") and snap.get("ready"):
            break
        time.sleep(0.5)
    return {"state": snap.get("standby_state"), "pid": snap.get("standby_pid"),
            "rss_mib": snap.get("standby_rss_mib"), "reason": snap.get("standby_reason"),
            "waited_s": round(time.monotonic() - t0, 1)}


def timed_fault(d: D.Daemon, phase: str, what: str, target: int | None, sig: int | None
                ) -> None:
    """One fault (a signal to target, SIGUSR1 to vllmwatch, or the leak trigger): times."""
    before = standby_ready(d) if d.phase != "standbyoff" else {}
    old = [t for t in G.tree(d) if not t[2].startswith("VLLMWATCH::")]
    mark, t_fault = d.log.count(), d.now()
    if what == "gpu_leak":
        G.LEAK_TRIGGER.write_text("go")
    elif what == "sigusr1":
        d.p.send_signal(signal.SIGUSR1)
    elif target is None or sig is None:
        D.emit(phase, what, error="target process not found", tree=[t for _, _, t in G.tree(d)])
        return
    else:
        os.kill(target, sig)
    idx, t_ready, ev = d.ready(mark, timeout=min(300.0, max(30.0, D.left() - 40)))
    begin = d.log.named("restart.begin", mark)
    started = d.log.named("child.started", mark)
    ok = idx >= 0 and ev.get("event") == "child.ready" and begin and started
    rec: dict[str, Any] = {"target_pid": target, "ready_event": ev.get("event"),
                           "standby_before": before}
    if ok:
        b, s = begin[0]["t"], started[0]["t"]
        rec.update(reason=begin[0].get("reason"), launch=started[0].get("launch"),
                   detect_s=round(b - t_fault, 2), begin_to_launch_s=round(s - b, 2),
                   launch_to_ready_s=round(t_ready - s, 2),
                   begin_to_ready_s=round(t_ready - b, 2),
                   fault_to_ready_s=round(t_ready - t_fault, 2),
                   events=G.events_after(d, mark, t_fault, "drain.begin", "child.stopping",
                                         "child.kill", "gpu.released", "gpu.release_timeout",
                                         "standby.used", "standby.discarded"))
    new_pid = started[0].get("pid") if started else None
    rec["old_tree_alive"] = [p for p in G.survivors(old) if p.get("pid") != new_pid]
    D.emit(phase, "restart_timing", fault=what, **rec)
    if ok:
        time.sleep(6)  # the leak rule's baseline (5 s), and a quiet moment for the view
        D.memory_view(d, phase)


def faults(phase: str, d: D.Daemon, leak: bool = True) -> None:
    """The four faults in order, each while the daemon is READY (standby built first)."""
    engine = D.find_titled("VLLM::EngineCore", d.p.pid)
    timed_fault(d, phase, "engine_kill9", engine, signal.SIGKILL)
    for what in ("api_server_sigkill", "gpu_leak", "sigusr1"):
        if D.left() < 90:
            D.emit(phase, "skipped", fault=what, left_s=round(D.left()))
            continue
        if what == "gpu_leak" and (not leak or not D.NV.ok):
            D.emit(phase, "skipped", fault=what, why="no NVML (dry run)" if not D.NV.ok
                   else "not asked")
            continue
        started = d.log.named("child.started")  # the API server: the child itself (its
        api = int(started[-1]["pid"]) if started else None  # title is not always `serve`)
        timed_fault(d, phase, what, api, signal.SIGKILL)


def run(phase: str, standby: str, cache: Path, args: dict[str, Any] | None = None,
        leak: bool = True, only: tuple[str, ...] = ()) -> None:
    if not DRY:
        G.ensure_big()
    G.LEAK_TRIGGER.unlink(missing_ok=True)
    conf = config(phase, standby, cache, args)
    D.emit(phase, "start", gpu=D.wait_idle_gpu(), cache_mib=D.du_mib(cache), standby=standby)
    d = D.Daemon(phase, conf, f"{phase}-vllmwatch.log")
    try:
        if not G.start(d, "ready", PORT, "q8b"):
            return
        if only:
            engine = D.find_titled("VLLM::EngineCore", d.p.pid)
            timed_fault(d, phase, "engine_kill9", engine, signal.SIGKILL)
            if "sigusr1" in only and D.left() > 90:
                timed_fault(d, phase, "sigusr1", None, None)
        else:
            faults(phase, d, leak)
        D.emit(phase, "status_at_end", status={k: d.status().get(k) for k in (
            "launch", "launches", "standby_state", "standby_pid", "standby_rss_mib",
            "standby_reason", "restarts_by_reason")})
    finally:
        G.LEAK_TRIGGER.unlink(missing_ok=True)
        G.stop_and_check(d)


def phase_standby() -> None:
    cache = D.WORK / "cache8b-standby"
    shutil.rmtree(cache, ignore_errors=True)  # the cold start of this run is the reference
    run("standby", '"auto"', cache)


def phase_standbyoff() -> None:
    run("standbyoff", "false", D.WORK / "cache8b-standby")


def phase_standbyapi2() -> None:
    run("standbyapi2", '"auto"', D.WORK / "cache8b-standby", {"api-server-count": 2},
        only=("engine_kill9", "sigusr1"))


D.PHASES.update(standby=phase_standby, standbyoff=phase_standbyoff,
                standbyapi2=phase_standbyapi2)
D.EST.update(standby=480, standbyoff=420, standbyapi2=300)
