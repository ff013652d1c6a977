"""Issue 17's phases: which shape serves two GPUs better, under load, and what a fault costs
the clients.

  pergpu      two daemons, tiny model, one per GPU; SIGUSR1 to one under load on the other
  pair        two daemons, 8B-shaped model, one per GPU, behind the load generator's round
              robin: throughput and latency at 16 and 128 clients, then kill -9 of one
              EngineCore under load (recovery, what clients saw)
  tp2big      one daemon, 8B-shaped model, TP=2: the same loads; a GPU leak injected into
              Worker_TP1 (the growth rule on the tree's sum), kill -9 of Worker_TP1 under
              load, kill -9 of EngineCore
  tp2api      tp2big's loads with two API server processes (--api-server-count 2), then
              kill -9 of EngineCore under load
  tp2apikill  tp2api's faults only, eager: EngineCore kill -9, then APIServer_1 kill -9
"""

from __future__ import annotations

import signal
import time

from bench.gpu import loadgen as LG
from bench.gpu.config import big_config, tiny_args, watch_config
from bench.gpu.daemon import GpuDaemon
from bench.gpu.inject import (
    completions,
    gpu_leak,
    inject_fault,
    leak_env,
    serving,
    under_load,
    warm_restart,
)
from bench.gpu.models import ensure_big, ensure_tiny
from bench.gpu.procs import find_titled, titled
from bench.gpu.run import Run

LEVELS = (16, 128)   # total concurrent clients, the same for both shapes
LOAD_S, WARM_S = 30.0, 5.0


def stop_all(daemons: list[GpuDaemon]) -> None:
    """No sweep until every daemon is stopped: it would SIGKILL another daemon's tree."""
    for i, d in enumerate(daemons):
        d.stop_and_check(sweep_after=i == len(daemons) - 1)


def pergpu(run: Run) -> None:
    ensure_tiny(run)
    daemons, ports = [], []
    for name, gpu in (("a", 0), ("b", 1)):
        ports.append(run.port(6 + gpu))
        conf = watch_config(run, f"pergpu-{name}", run.tiny, "tiny", ports[-1],
                            run.status_port(6 + gpu), run.work / f"cache-pergpu-{name}",
                            tiny_args(), gpus=(gpu,))
        daemons.append(GpuDaemon(run, "pergpu", conf, f"pergpu-{name}-vllmwatch.log"))
    try:
        for d, port, name in zip(daemons, ports, "ab", strict=True):
            if not serving(d, f"ready_{name}", port, "tiny"):
                return
        a, b = daemons
        before = run.nv.snapshot()
        with completions(ports[1], "tiny") as stats:
            warm_restart(a, ports[0], "tiny", what="restart_a")
        run.emit("pergpu", "restart_a_while_b_serves", b_load=stats, gpu_before=before,
                 gpu_after=run.nv.snapshot(), b_restarts=b.named("restart.begin"))
    finally:
        stop_all(daemons)


def measure_levels(run: Run, phase: str, ports: list[int], model: str) -> None:
    """Closed-loop streamed load at each level: 128 tokens out per request (ignore_eos)."""
    load_s, warm_s = LOAD_S * run.time_scale, WARM_S * run.time_scale
    for c in LEVELS:
        if run.left() < LOAD_S + 40:
            run.emit(phase, f"load_c{c}_skipped", left_s=round(run.left()))
            continue
        ld = LG.Load(ports, model, c).start()
        t0 = time.monotonic()
        time.sleep(load_s)
        t1 = time.monotonic()
        recs = ld.stop()
        run.emit(phase, f"load_c{c}", concurrency=c, backends=len(ports), max_tokens=128,
                 prompt_chars=len(LG.PROMPT), **LG.summary(recs, t0 + warm_s, t1),
                 gpu=run.nv.snapshot())


def pair(run: Run) -> None:
    ensure_big(run)
    daemons, ports = [], [run.port(8), run.port(9)]
    for name, gpu in (("a", 0), ("b", 1)):
        conf = big_config(run, f"pair-{name}", ports[gpu], run.status_port(8 + gpu),
                          run.work / f"cache8b-{name}", gpus=(gpu,))
        daemons.append(GpuDaemon(run, "pair", conf, f"pair-{name}-vllmwatch.log"))
    run.emit("pair", "start", gpu=run.nv.snapshot())
    try:
        for i, d in enumerate(daemons):
            if not serving(d, "ready_" + "ab"[i], ports[i], "q8b"):
                return
        run.pause(6)
        for d in daemons:
            d.memory_view()
        measure_levels(run, "pair", ports, "q8b")
        if run.left() > 130:
            a = daemons[0]
            under_load(a, "engine_kill9_a", ports, "q8b", lambda: inject_fault(
                a, "engine_kill9_a", ports[0], "q8b", find_titled("VLLM::EngineCore", a.pid),
                signal.SIGKILL))
            run.emit("pair", "b_restarts", events=daemons[1].named("restart.begin"))
    finally:
        stop_all(daemons)


def tp2big(run: Run) -> None:
    ensure_big(run)
    trigger = run.work / "gpuleak.trigger"
    trigger.unlink(missing_ok=True)
    port = run.port(10)
    conf = big_config(run, "tp2big", port, run.status_port(10), run.work / "cache8b-tp2",
                      {"tensor-parallel-size": 2}, gpus=(0, 1),
                      env=leak_env(trigger, "VLLM::Worker_TP1", "cuda:1"),
                      memory={"gpu_growth_limit": "4GiB", "sustain": 3})
    run.emit("tp2big", "start", gpu=run.wait_idle_gpu())
    d = GpuDaemon(run, "tp2big", conf, "tp2big-vllmwatch.log")
    try:
        if not serving(d, "ready", port, "q8b"):
            return
        run.pause(6)
        d.memory_view()
        measure_levels(run, "tp2big", [port], "q8b")
        if run.left() > 110:
            gpu_leak(d, "gpu_leak_in_worker_tp1", trigger, titled("VLLM::Worker_TP1", d.pid))
        if run.left() > 120:
            run.pause(3)
            under_load(d, "worker_tp1_kill9", [port], "q8b", lambda: inject_fault(
                d, "worker_tp1_kill9", port, "q8b", titled("VLLM::Worker_TP1", d.pid),
                signal.SIGKILL))
        if run.left() > 110:
            inject_fault(d, "engine_kill9", port, "q8b",
                         find_titled("VLLM::EngineCore", d.pid), signal.SIGKILL)
    finally:
        trigger.unlink(missing_ok=True)
        d.stop_and_check()


def tp2api(run: Run) -> None:
    """TP=2 with two API server processes (--api-server-count 2): is the single API server
    what held TP=2 at 128 clients (vLLM's stats said ~64 running of 128 sent)?"""
    ensure_big(run)
    port = run.port(11)
    conf = big_config(run, "tp2api", port, run.status_port(11), run.work / "cache8b-tp2",
                      {"tensor-parallel-size": 2, "api-server-count": 2}, gpus=(0, 1))
    run.emit("tp2api", "start", gpu=run.wait_idle_gpu())
    d = GpuDaemon(run, "tp2api", conf, "tp2api-vllmwatch.log")
    try:
        if not serving(d, "ready", port, "q8b"):
            return
        run.pause(6)
        d.memory_view()
        measure_levels(run, "tp2api", [port], "q8b")
        if run.left() > 110:
            under_load(d, "engine_kill9", [port], "q8b", lambda: inject_fault(
                d, "engine_kill9", port, "q8b", find_titled("VLLM::EngineCore", d.pid),
                signal.SIGKILL))
    finally:
        d.stop_and_check()


def tp2apikill(run: Run) -> None:
    """tp2api's faults only, eager (a faster start; detection does not depend on compiling):
    EngineCore kill -9 under load (re-run after the engine-watch fix), then kill -9 of one of
    the two API server processes."""
    ensure_big(run)
    port = run.port(12)
    conf = big_config(run, "tp2apikill", port, run.status_port(12), run.work / "cache8b-tp2e",
                      {"tensor-parallel-size": 2, "api-server-count": 2,
                       "enforce-eager": True}, gpus=(0, 1))
    run.emit("tp2apikill", "start", gpu=run.wait_idle_gpu())
    d = GpuDaemon(run, "tp2apikill", conf, "tp2apikill-vllmwatch.log")
    try:
        if not serving(d, "ready", port, "q8b"):
            return
        run.pause(6)
        under_load(d, "engine_kill9", [port], "q8b", lambda: inject_fault(
            d, "engine_kill9", port, "q8b", find_titled("VLLM::EngineCore", d.pid),
            signal.SIGKILL))
        if run.left() > 90:
            run.pause(3)
            under_load(d, "apiserver1_kill9", [port], "q8b", lambda: inject_fault(
                d, "apiserver1_kill9", port, "q8b", titled("VLLM::APIServer_1", d.pid),
                signal.SIGKILL))
    finally:
        d.stop_and_check()
