"""Issue 28's phases: restarts with the standby interpreter and EngineCore by fork, 8B shape.

  standby      cold start (empty compile cache: this run's reference), then EngineCore
               kill -9, API server SIGKILL, a GPU leak (gpuleak/, 1 GiB/s) and SIGUSR1, each
               with the standby on (`restart.standby` at its default, auto: on for a discrete
               GPU); before each fault the standby has finished its imports
  standbyoff   the same faults with `restart.standby = false` (the warm cache of `standby`)
  standbyapi2  `api-server-count = 2`, standby on: EngineCore kill -9, then SIGUSR1

vllmwatch's shipped [probe], [restart] and [drain] (nothing polls /readyz here, so a planned
restart skips the deregister delay, as on a box without a balancer); the leak rule's size
(gpu_growth_limit 4 GiB, baseline after 5 s); and `restart.stable_after = "20s"`, with each
fault injected at least that long after READY: each is then "the first failure after a stable
run", as a fault more than the shipped 10 min after the last one is (device time has no room
for 10 min between faults). The round-4 H200 run did not do this: its faults ~50 s apart were
failures in a row and paid the crash-loop backoff (5.45 s, 10.1 s; docs/GPU.md section 8). Each
record carries `failures_in_row` and the backoff it paid, so a run shows which case it
measured. Every fault adds one `restart_timing` line:
restart.begin -> child.started (and how: standby or fresh) -> child.ready, the standby's
state and RSS before it; every stop: nothing of a tree or a standby left, GPUs idle.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.gpu.calls import http
from bench.gpu.config import big_config, du_mib
from bench.gpu.daemon import GpuDaemon
from bench.gpu.inject import gpu_leak, inject_fault, leak_env, serving, warm_restart
from bench.gpu.models import ensure_big
from bench.gpu.procs import find_titled
from bench.gpu.run import Run

LEAK_LIMIT = {"gpu_growth_limit": "4GiB"}
STANDBY_WAIT = 120.0  # for the standby's imports (~19 s on the H200)
STABLE_AFTER_S = 20.0  # restart.stable_after here; a fault waits this long after READY
DRY_STABLE_AFTER_S = 2.0  # the suite's dry run over the fake vLLM: the same rule, less waiting


def stable_after(run: Run) -> float:
    return DRY_STABLE_AFTER_S if run.dry else STABLE_AFTER_S


FAULTS = ("engine_kill9", "api_server_sigkill", "gpu_leak", "sigusr1")


def standby_before(d: GpuDaemon, status_port: int) -> dict[str, Any]:
    """Wait (bounded) until /status says READY and the standby waits (or is off)."""
    t0 = time.monotonic()
    snap: dict[str, Any] = {}
    while time.monotonic() - t0 < min(STANDBY_WAIT, max(10.0, d.run.left() - 60)):
        code, body = http("GET", f"http://127.0.0.1:{status_port}/status")
        if code == 200:
            snap = json.loads(body)
        ready = d.named("child.ready")
        ready_for = time.monotonic() - d.t0 - ready[-1]["t"] if ready else 0.0
        if (snap.get("ready") and snap.get("standby_state") in ("waiting", "off")
                and ready_for > stable_after(d.run) + 1):
            break
        d.run.pause(0.5)
    return {"state": snap.get("standby_state"), "pid": snap.get("standby_pid"),
            "rss_mib": snap.get("standby_rss_mib"), "reason": snap.get("standby_reason"),
            "waited_s": round(time.monotonic() - t0, 1)}


def timed(d: GpuDaemon, what: str, status_port: int, fault: Callable[[], object]) -> None:
    """Run one fault (it waits for READY and reports itself); then its restart's timing."""
    before = standby_before(d, status_port)
    mark = d.count()
    fault()
    begin, started = d.named("restart.begin", mark), d.named("child.started", mark)
    ready = d.named("child.ready", mark)
    rec: dict[str, Any] = {"fault": what, "standby_before": before}
    if begin and started and ready:
        b, s, r = begin[0]["t"], started[0]["t"], ready[0]["t"]
        backoff = d.named("restart.backoff", mark)
        rec.update(reason=begin[0].get("reason"), launch=started[0].get("launch"),
                   failures_in_row=begin[0].get("failures_in_row"),
                   backoff_s=backoff[0].get("delay_s") if backoff else 0.0,
                   begin_to_launch_s=round(s - b, 2), launch_to_ready_s=round(r - s, 2),
                   begin_to_ready_s=round(r - b, 2),
                   used=d.named("standby.used", mark)[:1],
                   compile_cache_hit=ready[0].get("compile_cache_hit"),
                   reuse=ready[0].get("reuse"), phases=ready[0].get("phases"),
                   cache_missed=d.named("startup.cache_missed", mark),
                   discarded=d.named("standby.discarded", mark)[:1])
    else:
        rec["error"] = "no restart.begin, child.started and child.ready after the fault"
    d.run.emit(d.phase, "restart_timing", **rec)
    if ready:
        d.run.pause(6)  # the leak rule's baseline (5 s), and a quiet moment for the view
        d.memory_view()


def _run(run: Run, phase: str, standby: bool | str, cache: Path, n: int,
         args: dict[str, Any] | None = None, faults: tuple[str, ...] = FAULTS) -> None:
    ensure_big(run)
    trigger = run.work / f"{phase}.trigger"
    trigger.unlink(missing_ok=True)
    port, status_port = run.port(n), run.status_port(n)
    # The dry run's fake is a CPU config there (no NVML in the daemon): force the standby.
    setting = True if run.dry and standby == "auto" else standby
    conf = big_config(run, phase, port, status_port, cache, args, env=leak_env(trigger),
                      memory=LEAK_LIMIT, shipped_probe=True,
                      restart={"standby": setting, "stable_after": f"{stable_after(run):.0f}s"},
                      shipped_drain=True)
    run.emit(phase, "start", gpu=run.wait_idle_gpu(), cache_mib=du_mib(cache),
             standby=setting)
    d = GpuDaemon(run, phase, conf, f"{phase}-vllmwatch.log")
    try:
        if not serving(d, "ready", port, "q8b"):
            return
        for what in faults:
            if run.left() < 90:
                run.emit(phase, "skipped", fault=what, left_s=round(run.left()))
                continue
            timed(d, what, status_port, _fault(d, what, port, trigger))
        run.emit(phase, "status_at_end", status={k: d.status().get(k) for k in (
            "launch", "launches", "standby_state", "standby_pid", "standby_rss_mib",
            "standby_reason", "restarts_by_reason")})
    finally:
        trigger.unlink(missing_ok=True)
        d.stop_and_check()


def _fault(d: GpuDaemon, what: str, port: int, trigger: Path) -> Callable[[], object]:
    if what == "sigusr1":
        return lambda: warm_restart(d, port, "q8b", what="sigusr1")
    if what == "gpu_leak":
        return lambda: gpu_leak(d, what, trigger, find_titled("VLLM::EngineCore", d.pid))
    if what == "api_server_sigkill":  # the child itself: after a handover its title is the
        started = d.named("child.started")  # argv only where setproctitle is there
        target = int(started[-1]["pid"]) if started else None
        return lambda: inject_fault(d, what, port, "q8b", target, signal.SIGKILL)
    return lambda: inject_fault(d, what, port, "q8b", find_titled("VLLM::EngineCore", d.pid),
                                signal.SIGKILL)


def standby(run: Run) -> None:
    cache = run.work / "cache8b-standby"
    shutil.rmtree(cache, ignore_errors=True)  # the cold start of this run is the reference
    _run(run, "standby", "auto", cache, 20)


def standbyoff(run: Run) -> None:
    _run(run, "standbyoff", False, run.work / "cache8b-standby", 21)


def standbyapi2(run: Run) -> None:
    _run(run, "standbyapi2", "auto", run.work / "cache8b-standby", 22,
         {"api-server-count": 2}, faults=("engine_kill9", "sigusr1"))
