"""Issue 13's phases: start-up cost (matrix), faults on the 8B-shaped model (faults), and
tensor parallelism on the tiny model (tp2).

  matrix   cold start (fresh caches) and a warm restart (SIGUSR1) in one daemon, then a
           daemon with the kernel step on, then one without the warm-up request; each:
           READY, startup phases, TTFT of the first request after READY
  faults   one daemon: EngineCore SIGKILL and SIGSTOP, API server SIGKILL (engine
           orphaned), a GPU leak injected into EngineCore (gpuleak/sitecustomize.py)
  tp2      TP=2 on GPUs 0,1: memory per GPU vs NVML, kill -9 and SIGSTOP of one TP worker
"""

from __future__ import annotations

import shutil
import signal
from typing import Any

from bench.gpu.config import big_config, du_mib, tiny_args, watch_config
from bench.gpu.daemon import GpuDaemon
from bench.gpu.inject import gpu_leak, inject_fault, leak_env, serving, warm_restart
from bench.gpu.models import ensure_big, ensure_tiny
from bench.gpu.procs import api_server, find_titled, titled
from bench.gpu.run import Run

LEAK_LIMIT = {"gpu_growth_limit": "4GiB", "sustain": 3}


def matrix(run: Run) -> None:
    ensure_big(run)
    cache = run.work / "cache8b"
    shutil.rmtree(cache, ignore_errors=True)  # cold: nothing compiled yet
    port = run.port(3)
    runs: list[tuple[str, dict[str, Any]]] = [
        ("cold", {"kernels": False, "warmup_request": True}),
        ("kernels_on", {"kernels": True, "warmup_request": True}),
        ("no_warmup_request", {"kernels": False, "warmup_request": False})]
    for i, (name, kw) in enumerate(runs):
        if i and run.left() < 130:
            run.emit("matrix", "skipped", run=name, left_s=round(run.left()))
            continue
        conf = big_config(run, f"matrix-{name}", port, run.status_port(3), cache, **kw)
        run.emit("matrix", f"start_{name}", gpu=run.wait_idle_gpu(), cache_mib=du_mib(cache),
                 **kw)
        d = GpuDaemon(run, "matrix", conf, f"matrix-{name}-vllmwatch.log")
        try:
            if not serving(d, name, port, "q8b"):
                continue
            if i == 0:
                run.emit("matrix", "cache_after_cold", compile_cache_mib=du_mib(cache / "vllm"),
                         triton_mib=du_mib(cache / "triton"))
                warm_restart(d, port, "q8b")
            if i == len(runs) - 1 and run.left() > 150:
                inject_fault(d, "kill_engine", port, "q8b",
                             find_titled("VLLM::EngineCore", d.pid), signal.SIGKILL)
        finally:
            d.stop_and_check()


def faults(run: Run) -> None:
    ensure_big(run)
    trigger = run.work / "gpuleak.trigger"
    trigger.unlink(missing_ok=True)
    port = run.port(4)
    conf = big_config(run, "faults", port, run.status_port(4), run.work / "cache8b",
                      env=leak_env(trigger), memory=LEAK_LIMIT)
    run.emit("faults", "start", gpu=run.wait_idle_gpu())
    d = GpuDaemon(run, "faults", conf, "faults-vllmwatch.log")
    try:
        if not serving(d, "ready", port, "q8b"):
            return
        run.pause(6)  # baseline (baseline_delay 5 s)
        d.memory_view()
        inject_fault(d, "engine_kill9", port, "q8b",
                     find_titled("VLLM::EngineCore", d.pid), signal.SIGKILL)
        if run.left() > 150:
            inject_fault(d, "engine_sigstop", port, "q8b",
                         find_titled("VLLM::EngineCore", d.pid), signal.SIGSTOP)
        if run.left() > 120:
            inject_fault(d, "api_server_sigkill", port, "q8b", api_server(d.pid),
                         signal.SIGKILL)
        if run.left() > 120:
            run.pause(6)  # a new baseline after the last restart
            gpu_leak(d, "gpu_leak", trigger, find_titled("VLLM::EngineCore", d.pid))
    finally:
        trigger.unlink(missing_ok=True)
        d.stop_and_check()


def tp2(run: Run) -> None:
    ensure_tiny(run)
    port = run.port(5)
    conf = watch_config(run, "tp2", run.tiny, "tiny", port, run.status_port(5),
                        run.work / "cache-tp2", {**tiny_args(), "tensor-parallel-size": 2},
                        gpus=(0, 1))
    run.emit("tp2", "start", gpu=run.wait_idle_gpu())
    d = GpuDaemon(run, "tp2", conf, "tp2-vllmwatch.log")
    try:
        if not serving(d, "ready", port, "tiny"):
            return
        run.pause(7)
        d.memory_view()
        inject_fault(d, "worker_kill9", port, "tiny", titled("VLLM::Worker_TP1", d.pid),
                     signal.SIGKILL)
        if run.left() > 150:
            run.pause(3)
            inject_fault(d, "worker_sigstop", port, "tiny", titled("VLLM::Worker_TP1", d.pid),
                         signal.SIGSTOP)
    finally:
        d.stop_and_check()
