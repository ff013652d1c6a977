"""The three things phases do to a running vLLM under vllmwatch, each written once: a fault
(a signal to one process of the tree), a warm restart (SIGUSR1), and a GPU leak (the
gpuleak/ hook, triggered by a file); plus load on the side while one of them happens.

Each records NVML before and after, the detect time (events after the fault), the GPU
release (gpu.released), READY again, and which processes of the old tree survived.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.gpu import loadgen as LG
from bench.gpu.calls import completion, health, ttft
from bench.gpu.daemon import Found, GpuDaemon
from bench.gpu.procs import survivors, title, tree

HERE = Path(__file__).resolve().parent
HOOK_DIR = HERE / "gpuleak"
FAULT_EVENTS = ("probe.failed", "child.exited", "restart.begin", "child.stopping",
                "child.kill", "leftovers.killed", "leftovers.remaining", "gpu.released",
                "gpu.release_timeout", "child.started")
LEAK_EVENTS = ("memory.rule_held", "memory.rule_fired", "restart.begin", "gpu.released",
               "gpu.release_timeout", "child.started")


def ready_again(found: Found) -> bool:
    return found[0] >= 0 and found[2].get("event") == "child.ready"


@contextmanager
def sampling(d: GpuDaemon, port: int) -> Iterator[tuple[list[Any], list[Any]]]:
    """NVML (used memory, process count) and /health every 0.2 s, on change only, as
    (seconds since entry, ...) in the two lists yielded."""
    nvml: list[tuple[float, int | None, int]] = []
    healths: list[tuple[float, int | None]] = []
    stop, t0 = threading.Event(), time.monotonic()

    def sample() -> None:
        last_nv: tuple[int | None, int] | None = None
        last_h: object = "x"
        while not stop.is_set():
            t = round(time.monotonic() - t0, 2)
            used, pids = d.run.nv.used_mib(), d.run.nv.procs()
            key = (used // 1024 if used else used, len(pids))
            if key != last_nv:
                nvml.append((t, used, len(pids)))
                last_nv = key
            h = health(port)
            if h != last_h:
                healths.append((t, h))
                last_h = h
            time.sleep(0.2)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        yield nvml, healths
    finally:
        stop.set()
        th.join(3)


def inject_fault(d: GpuDaemon, what: str, port: int, model: str, target: int | None,
                 sig: int, timeout: float = 420) -> Found | None:
    """Send sig to target (a pid of d's tree); report detection, release, READY again,
    survivors, NVML and /health around it, and the first request after."""
    run = d.run
    if target is None:
        run.emit(d.phase, what, error="target process not found",
                 tree=[t for _, _, t in tree(d.pid)])
        return None
    old, name, before = tree(d.pid), title(target), run.nv.snapshot()
    mark, t_fault = d.count(), d.now()
    with sampling(d, port) as (nvml, healths):
        os.kill(target, sig)
        found = d.ready(mark, timeout=min(timeout, max(30.0, run.left() - 25)))
    _, t_ready, ev = found
    run.emit(d.phase, what, target_pid=target, target_title=name,
             target_alive=Path(f"/proc/{target}").exists(), signal=sig, gpu_before=before,
             gpu_at_ready=run.nv.snapshot(),
             ready_again_after_fault_s=round(t_ready - t_fault, 2) if ready_again(found)
             else None, ready_event=ev, events=d.events_after(mark, t_fault, *FAULT_EVENTS),
             health=healths[:12], nvml_trace=nvml[:40], old_tree=survivors(old),
             old_tree_size=len(old))
    if ready_again(found):
        run.emit(d.phase, what + "_first_request", **ttft(port, model))
    return found


def warm_restart(d: GpuDaemon, port: int, model: str, what: str = "warm_restart",
                 timeout: float = 300) -> Found:
    """SIGUSR1 (a graceful restart of vLLM, caches kept): READY again and its start
    report, the restart's events, compile-cache hits, the first request after."""
    run = d.run
    old, mark = tree(d.pid), d.count()
    ts = d.send(signal.SIGUSR1)
    found = d.ready(mark, timeout=min(timeout, max(30.0, run.left() - 25)))
    d.start_report("ready_" + what, mark, found)
    run.emit(d.phase, what, sigusr1_to_ready_s=round(found[1] - ts, 2)
             if ready_again(found) else None,
             restart_begin=d.named("restart.begin", mark)[:1],
             gpu_released=d.named("gpu.released", mark)[:1], old_tree=survivors(old),
             cache_hits=[ln for ln in d.lines if ln[0] >= ts and "Directly load" in ln[1]][:3])
    if ready_again(found):
        run.emit(d.phase, what + "_first_request", **ttft(port, model))
    return found


def leak_env(trigger: Path, title_: str = "", device: str = "") -> dict[str, str]:
    """[vllm.env] for the gpuleak hook: 1 GiB a step, 8 steps, once trigger exists."""
    env = {"PYTHONPATH": str(HOOK_DIR), "VLLMWATCH_GPU_LEAK_TRIGGER": str(trigger),
           "VLLMWATCH_GPU_LEAK_MIB": "1024", "VLLMWATCH_GPU_LEAK_STEPS": "8"}
    if title_:
        env["VLLMWATCH_GPU_LEAK_TITLE"] = title_
    if device:
        env["VLLMWATCH_GPU_LEAK_DEVICE"] = device
    return env


def gpu_leak(d: GpuDaemon, what: str, trigger: Path, target: int | None) -> Found:
    """Start the leak in target (the hook's process) and wait: the growth rule fires, the
    restart, READY again."""
    run = d.run
    mark, t0, before = d.count(), d.now(), run.nv.snapshot()
    trigger.write_text("go")
    limit = 5.0 if run.dry else 150.0  # the dry run's fake has no GPU to leak: no restart
    found = d.ready(mark, timeout=min(limit, max(30.0, run.left() - 25)))
    run.emit(d.phase, what, target_pid=target, gpu_before=before,
             events=d.events_after(mark, t0, *LEAK_EVENTS),
             ready_again_after_trigger_s=round(found[1] - t0, 2) if found[0] >= 0 else None,
             gpu_at_ready=run.nv.snapshot(), trigger_left=trigger.exists(),
             leak_lines=[ln for ln in d.lines if "[gpuleak]" in ln[1]][:10])
    return found


def under_load(d: GpuDaemon, what: str, ports: list[int], model: str,
               act: Callable[[], object], clients: int = 16) -> None:
    """act() while `clients` clients load every backend; then what they saw, from the act
    until 10 s after it returned."""
    ld = LG.Load(ports, model, clients).start()
    d.run.pause(8)
    t_fault = time.monotonic()
    act()
    d.run.pause(10)
    t_end = time.monotonic()
    recs = ld.stop()
    d.run.emit(d.phase, what + "_clients", clients=clients, backends=len(ports),
               before_fault=LG.summary(recs, t_fault - 6 * d.run.time_scale, t_fault),
               after_fault=LG.outage(recs, t_fault, t_end))


@contextmanager
def completions(port: int, model: str) -> Iterator[dict[str, Any]]:
    """Completions back to back while inside: counts of ok and failed, worst latency."""
    out: dict[str, Any] = {}
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            r = completion(port, model, max_tokens=8, timeout=30)
            key = "ok" if r.get("status") == 200 else "failed"
            out[key] = out.get(key, 0) + 1
            out["worst_s"] = max(out.get("worst_s", 0.0), r["seconds"])
            if key == "failed" and len(out.setdefault("errors", [])) < 3:
                out["errors"].append(r)

    th = threading.Thread(target=load, daemon=True)
    th.start()
    try:
        yield out
    finally:
        stop.set()
        th.join(40)


def serving(d: GpuDaemon, what: str, port: int, model: str, since: int = 0,
            timeout: float = 480) -> bool:
    """READY from index since (its start report), then two first requests (TTFT); False,
    and a `<what>_failed` line, when READY did not come."""
    found = d.ready(since, timeout=timeout)
    d.start_report(what, since, found)
    if not ready_again(found):
        d.run.emit(d.phase, what + "_failed", event=found[2])
        return False
    d.run.emit(d.phase, what + "_first_request", **ttft(port, model))
    d.run.emit(d.phase, what + "_second_request", **ttft(port, model))
    return True
