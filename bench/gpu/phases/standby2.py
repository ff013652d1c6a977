"""Issue 27's phases: the standby interpreter and EngineCore-by-fork on two GPUs (8B shape).

  tp2standby     one daemon, TP=2 over GPUs 0 and 1, `restart.standby` on: a cold start
                 (empty compile cache: the run's reference), then EngineCore kill -9,
                 Worker_TP1 kill -9 and SIGUSR1, each once the standby has its imports; then,
                 if the budget allows, tp2standbyoff's half
  tp2standbyoff  the same three faults with `restart.standby = false` (warm cache)
  pairstandby    one daemon per GPU, a standby each: SIGUSR1 to a; b's standby (pid and start
                 time), b's child and GPU 1 before and after; the host memory of both standbys

Every fault is one `restart_timing` line: detect_s, begin_to_launch_s, launch_to_ready_s,
begin_to_ready_s (restart.begin -> child.ready) beside the cold start's `cold_launch_to_ready_s`,
`launch` (standby | fresh), the standby before it, `release` (NVML on each GPU just before the
new child started: back to idle, no pid of the old tree listed) and the old tree's survivors;
then `workers_start` (fork or spawn, the variable, vLLM's own lines). Every stop: `after_stop`
plus `standby_after_stop` (no standby of the run alive).
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable
from typing import Any

from bench.gpu.config import big_config
from bench.gpu.daemon import GpuDaemon
from bench.gpu.inject import serving, warm_restart
from bench.gpu.models import ensure_big
from bench.gpu.procs import find_titled, survivors, titled, tree
from bench.gpu.run import Run
from bench.gpu.standbys import (
    alive,
    at_launch,
    created,
    host_memory,
    per_gpu,
    standby_view,
    worker_start,
)

TP2 = {"tensor-parallel-size": 2}
Act = Callable[[GpuDaemon], None]


def _restart(run: Run, on: bool) -> dict[str, Any]:
    """vllmwatch's shipped [restart] and the standby setting (issue 28's phases do the same)."""
    # "auto" is what ships (on for a discrete GPU); the dry run's daemon has no NVML to say
    # "discrete", so it asks for the standby outright.
    return {"standby": ("true" if run.dry else "auto") if on else "false"}


def _shipped(run: Run, on: bool) -> dict[str, Any]:
    """big_config's keywords: shipped [probe], [restart] (+ standby) and [drain], as in
    phases/standby.py, so that TP=2 here reads beside TP=1 there."""
    return {"restart": _restart(run, on), "shipped_probe": True, "shipped_drain": True}


def _signal(title: str, sig: int) -> Act:
    def act(d: GpuDaemon) -> None:
        pid = titled(title, d.pid) or find_titled(title, d.pid)
        if pid is None:
            raise LookupError(f"no {title} under vllmwatch {d.pid}")
        d.run.emit(d.phase, "fault_target", title=title, pid=pid, signal=sig)
        os.kill(pid, sig)
    return act


def _sigusr1(d: GpuDaemon) -> None:
    d.send(signal.SIGUSR1)


FAULTS: tuple[tuple[str, Act], ...] = (
    ("engine_kill9", _signal("VLLM::EngineCore", signal.SIGKILL)),
    ("worker_tp1_kill9", _signal("VLLM::Worker_TP1", signal.SIGKILL)),
    ("sigusr1", _sigusr1),
)


def timed(d: GpuDaemon, what: str, act: Act, idle: list[int], cold: float | None,
          on: bool = True) -> bool:
    """One fault while READY (the standby built first, when on): its restart_timing line."""
    run = d.run
    before = standby_view(d, wait=on)
    old = [p for p in tree(d.pid) if p[0] != before.get("standby_pid")]
    mark, t_fault = d.count(), d.now()
    with per_gpu(d) as samples:
        try:
            act(d)
        except LookupError as exc:
            run.emit(d.phase, "restart_timing", fault=what, error=str(exc))
            return False
        found = d.ready(mark, timeout=min(420.0, max(30.0, run.left() - 30)))
    begin, started = d.named("restart.begin", mark), d.named("child.started", mark)
    ok = found[0] >= 0 and found[2].get("event") == "child.ready" and begin and started
    rec: dict[str, Any] = {"ready_event": found[2].get("event"), "standby_before": before,
                           "cold_launch_to_ready_s": cold}
    new_pid = started[0].get("pid") if started else None
    if ok:
        b, s, r = begin[0]["t"], started[0]["t"], found[1]
        rec.update(reason=begin[0].get("reason"), launch=started[0].get("launch"),
                   detect_s=round(b - t_fault, 2), begin_to_launch_s=round(s - b, 2),
                   launch_to_ready_s=round(r - s, 2), begin_to_ready_s=round(r - b, 2),
                   fault_to_ready_s=round(r - t_fault, 2),
                   release=at_launch(samples, s, {p for p, _, _ in old}, idle),
                   events=d.events_after(mark, t_fault, "child.exited", "child.stopping",
                                         "child.kill", "gpu.released", "gpu.release_timeout",
                                         "standby.used", "standby.discarded"))
    rec["old_tree_alive"] = [p for p in survivors(old) if p.get("pid") != new_pid]
    run.emit(d.phase, "restart_timing", fault=what, **rec)
    if ok:
        run.pause(6)  # vLLM's workers up and the standby's next imports under way
        run.emit(d.phase, "workers_start", after=what, **worker_start(d))
    return bool(ok)


def stop_checked(d: GpuDaemon, sweep_after: bool = True) -> None:
    """stop_and_check, then: the standby of the end (and every one seen) is gone."""
    last = standby_view(d, wait=False)
    pid = last.get("standby_pid")
    born = created(pid if isinstance(pid, int) else None)
    d.stop_and_check(sweep_after)
    d.run.emit(d.phase, "standby_after_stop", standby_pid=pid,
               alive=alive(pid if isinstance(pid, int) else None, born), last_status=last)


def tp2_half(run: Run, phase: str, on: bool) -> None:
    """A TP=2 daemon, standby on or off: READY, the three faults, the stop."""
    ensure_big(run)
    n = 13 if on else 14
    port = run.port(n)
    conf = big_config(run, phase, port, run.status_port(n), run.work / "cache8b-tp2standby",
                      TP2, gpus=(0, 1), **_shipped(run, on))
    idle = run.wait_idle_gpu()
    run.emit(phase, "start", gpu=idle, standby_setting=_restart(run, on)["standby"], tp=2)
    d = GpuDaemon(run, phase, conf, f"{phase}-vllmwatch.log")
    try:
        if not serving(d, "ready", port, "q8b"):
            return
        first = d.named("child.started")[:1]
        ready = d.named("child.ready")[:1]
        cold = round(ready[0]["t"] - first[0]["t"], 2) if first and ready else None
        run.emit(phase, "cold_start", launch_to_ready_s=cold,
                 ready_at_s=ready[0]["t"] if ready else None,
                 launch=first[0].get("launch") if first else None)
        run.emit(phase, "workers_start", after="cold_start", **worker_start(d))
        for what, act in FAULTS:
            if run.left() < 100:
                run.emit(phase, "skipped", fault=what, left_s=round(run.left()))
                continue
            timed(d, what, act, idle.get("used_by_gpu_mib") or [], cold, on)
        run.emit(phase, "status_at_end", **standby_view(d, wait=False))
    finally:
        stop_checked(d)


def tp2standby(run: Run) -> None:
    shutil.rmtree(run.work / "cache8b-tp2standby", ignore_errors=True)  # cold: the reference
    tp2_half(run, "tp2standby", on=True)
    if run.left() > 330 and not run.dry:  # the dry run has tp2standbyoff on its own
        tp2_half(run, "tp2standbyoff", on=False)
    else:
        run.emit("tp2standby", "off_half_skipped", left_s=round(run.left()),
                 why="run `drive tp2standbyoff` in its own call")


def tp2standbyoff(run: Run) -> None:
    tp2_half(run, "tp2standbyoff", on=False)


def pairstandby(run: Run) -> None:
    """One daemon per GPU with a standby each: a restart of a leaves b alone."""
    ensure_big(run)
    ports = [run.port(15), run.port(16)]
    idle = run.wait_idle_gpu()
    run.emit("pairstandby", "start", gpu=idle, standby_setting=_restart(run, True)["standby"])
    daemons = []
    for name, gpu in (("a", 0), ("b", 1)):
        conf = big_config(run, f"pairstandby-{name}", ports[gpu], run.status_port(15 + gpu),
                          run.work / f"cache8b-pairstandby-{name}", gpus=(gpu,),
                          **_shipped(run, True))
        daemons.append(GpuDaemon(run, "pairstandby", conf, f"pairstandby-{name}-vllmwatch.log"))
    try:
        for i, d in enumerate(daemons):
            if not serving(d, "ready_" + "ab"[i], ports[i], "q8b"):
                return
        a, b = daemons
        views = [standby_view(d) for d in daemons]
        run.emit("pairstandby", "standbys_host_memory", **_costs(views))
        b_before = _side(b, views[1], gpu=1)
        b_mark = b.count()
        found = warm_restart(a, ports[0], "q8b", what="restart_a")
        run.pause(3)
        b_after = _side(b, standby_view(b, wait=False), gpu=1)
        pid = b_before["standby_pid"]
        run.emit("pairstandby", "b_untouched", a_ready_again=found[0] >= 0,
                 a_launch=(a.named("child.started")[-1:] or [{}])[0].get("launch"),
                 b_standby_alive=alive(pid, b_before["standby_created"]),
                 b_same_standby=b_after["standby_pid"] == pid,
                 b_same_child=b_after["child_pid"] == b_before["child_pid"],
                 b_gpu_same_procs=b_after["gpu_pids"] == b_before["gpu_pids"],
                 b_gpu_used_delta_mib=_delta(b_before["gpu_used_mib"], b_after["gpu_used_mib"]),
                 b_events=[e.get("event") for e in b.d.events[b_mark:]
                           if e.get("event") != "child.line" and
                           str(e.get("event", "")).split(".")[0] in
                           ("restart", "child", "standby", "gpu")],
                 before=b_before, after=b_after)
        run.emit("pairstandby", "standbys_host_memory_after",
                 **_costs([standby_view(d) for d in daemons]))
    finally:
        for i, d in enumerate(daemons):  # no sweep until both are stopped
            stop_checked(d, sweep_after=i == len(daemons) - 1)


def _side(d: GpuDaemon, view: dict[str, Any], gpu: int) -> dict[str, Any]:
    """One daemon's standby, child and GPU as seen now."""
    pid = view.get("standby_pid")
    started = d.named("child.started")
    used = d.run.nv.used_by_gpu()
    return {"standby_pid": pid, "standby_created": created(pid if isinstance(pid, int)
                                                           else None),
            "standby_state": view.get("standby_state"),
            "child_pid": started[-1].get("pid") if started else None,
            "gpu_pids": sorted(p for p, _ in d.run.nv.procs(gpu)) if d.run.nv.ok else None,
            "gpu_used_mib": used[gpu] if gpu < len(used) else None}


def _delta(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before


def _costs(views: list[dict[str, Any]]) -> dict[str, Any]:
    """Host memory of the standbys: what /status says, and RSS/PSS/USS read here."""
    each = [{**host_memory(v.get("standby_pid") if isinstance(v.get("standby_pid"), int)
                           else None), "status_rss_mib": v.get("standby_rss_mib"),
             "state": v.get("standby_state")} for v in views]
    return {"standbys": each,
            "total_rss_mib": round(sum(e.get("rss_mib", 0.0) for e in each), 1),
            "total_pss_mib": round(sum(e.get("pss_mib", 0.0) for e in each), 1)}
