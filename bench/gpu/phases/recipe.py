"""The recipe's phases on one GPU, tiny model unless said: serve (plain `vllm serve`), watch
(vllmwatch run, kill -9 of EngineCore, SIGTERM), prewarm (vllmwatch prewarm, a direct FA
warm-up, a cold start and a warm restart), big (the 8B-shaped model: cold start, warm
restart, kill -9 of EngineCore)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time

from bench.gpu.calls import completion, health, http, metric_names
from bench.gpu.config import big_config, cache_env, du_mib, tiny_args, watch_config
from bench.gpu.daemon import GpuDaemon, LineNotes
from bench.gpu.inject import inject_fault, ready_again, warm_restart
from bench.gpu.models import ensure_big, ensure_tiny
from bench.gpu.phases.probes import fa_direct
from bench.gpu.procs import descendants, find_titled, title, vllm_like
from bench.gpu.run import TINY_KV, Run


def serve(run: Run) -> None:
    """Plain `vllm serve`, the tiny model, compile cache in cache1 (shared with `watch`)."""
    ensure_tiny(run)
    port = run.port(0)
    env = {**os.environ, **cache_env(run.work / "cache1")}
    cmd = [*run.vllm, "serve", str(run.tiny), "--served-model-name", "tiny", "--host",
           "127.0.0.1", "--port", str(port), "--max-model-len", "2048",
           "--kv-cache-memory-bytes", str(TINY_KV), "--dtype", "bfloat16"]
    run.emit("serve", "start", command=" ".join(cmd), gpu=run.wait_idle_gpu())
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    run.own(p.pid)
    notes = LineNotes(run.logs / "serve-vllm.log", t0)
    assert p.stdout is not None
    out = p.stdout

    def read() -> None:
        for raw in iter(out.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            notes.note(time.monotonic(), line, line)

    threading.Thread(target=read, daemon=True).start()
    t_health = None
    try:
        while time.monotonic() - t0 < min(240, run.left() - 40) and p.poll() is None:
            if health(port, timeout=2) == 200:
                t_health = round(time.monotonic() - t0, 2)
                break
            time.sleep(0.25)
        run.emit("serve", "health_200", seconds_from_spawn=t_health, exit_code=p.poll(),
                 milestones_s=notes.first, lines=notes.lines[:40])
        if t_health is not None:
            _serving(run, port, p.pid)
    finally:
        _stop_plain(run, p)
        notes.close()
    if t_health is None:
        raise RuntimeError("vLLM never answered /health 200")


def _serving(run: Run, port: int, pid: int) -> None:
    run.emit("serve", "completion", **completion(port, "tiny"))
    run.emit("serve", "chat", status=http("POST", f"http://127.0.0.1:{port}/v1/chat/completions",
             {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
              "max_tokens": 4}, 60)[0])
    run.emit("serve", "metrics", **metric_names(port))
    run.emit("serve", "tree", api_pid=pid, engine_pid=find_titled("VLLM::EngineCore", pid),
             tree=[{"pid": d, "title": title(d)} for d in descendants(pid)],
             nvml=run.nv.snapshot())


def _stop_plain(run: Run, p: subprocess.Popen[bytes]) -> None:
    """SIGTERM the plain vLLM's group: exit code, seconds, what is left, the GPU after."""
    ts = time.monotonic()
    with contextlib.suppress(OSError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        code = p.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        code = p.wait(10)
    stopped = round(time.monotonic() - ts, 2)
    time.sleep(1)
    run.emit("serve", "sigterm", exit_code=code, seconds=stopped, left_ours=run.ours(),
             vllm_like_anywhere=vllm_like(), gpu_after=run.wait_idle_gpu(30),
             cache1_mib=du_mib(run.work / "cache1"))
    run.sweep("serve")


def start(d: GpuDaemon, what: str = "ready", timeout: float = 420) -> bool:
    """READY (or not) and its start report; raises when it did not come."""
    found = d.ready(0, timeout=timeout)
    d.start_report(what, 0, found)
    if not ready_again(found):
        raise RuntimeError(f"not READY: {found[2].get('event')}")
    return True


def watch(run: Run) -> None:
    ensure_tiny(run)
    port = run.port(1)
    conf = watch_config(run, "watch", run.tiny, "tiny", port, run.status_port(1),
                        run.work / "cache1", tiny_args(eager=False))
    vw = run.cmd(run.vllmwatch)
    run.emit("watch", "check", out=run.sh(f"{vw} check --config {conf}", 180).splitlines()[-40:])
    run.emit("watch", "print_command", out=run.sh(f"{vw} print-command --config {conf}", 120))
    run.emit("watch", "start", gpu=run.wait_idle_gpu(), cache1_mib=du_mib(run.work / "cache1"))
    d = GpuDaemon(run, "watch", conf, "watch-vllmwatch.log")
    try:
        start(d)
        run.emit("watch", "completion", **completion(port, "tiny"))
        run.pause(7)  # memory samples and the baseline (baseline_delay 5 s)
        d.memory_view()
        inject_fault(d, "kill_engine", port, "tiny", find_titled("VLLM::EngineCore", d.pid),
                     signal.SIGKILL)
        run.pause(3)
        st = d.status()
        run.emit("watch", "status_after_recovery",
                 restarts_by_reason=st.get("restarts_by_reason"),
                 last_reason=st.get("last_reason"),
                 last_reason_detail=st.get("last_reason_detail"), state=st.get("state"),
                 memory_source=st.get("memory", {}).get("source"),
                 gpu_tree_mib=st.get("memory", {}).get("gpu_tree_mib"))
    finally:
        d.stop()


def prewarm(run: Run) -> None:
    ensure_tiny(run)
    cache = run.work / "cache2"  # fresh: nothing compiled for this config yet
    port = run.port(2)
    conf = watch_config(run, "prewarm", run.tiny, "tiny", port, run.status_port(2), cache,
                        tiny_args(eager=False))
    t = time.monotonic()
    r = subprocess.run([*run.vllmwatch, "prewarm", "--config", str(conf), "--json"],
                       capture_output=True, text=True, timeout=300)
    (run.logs / "prewarm-cmd.log").write_text(r.stdout + "\n---stderr---\n" + r.stderr)
    try:
        rep = json.loads(r.stdout)
    except ValueError:
        rep = {"rc": r.returncode, "stdout": r.stdout[-1500:], "stderr": r.stderr[-1500:]}
    run.emit("prewarm", "vllmwatch_prewarm", rc=r.returncode,
             wall_s=round(time.monotonic() - t, 2), report=rep)
    # What vLLM itself runs on this GPU (FA3), in a fresh process, for both model shapes.
    fa_direct(run, "prewarm", 2, 1, 64)
    fa_direct(run, "prewarm", 32, 8, 128)
    if run.left() < 200:
        run.emit("prewarm", "skipped_restarts", left_s=round(run.left()))
        return
    run.emit("prewarm", "start_cold", gpu=run.wait_idle_gpu(), cache2_mib=du_mib(cache))
    d = GpuDaemon(run, "prewarm", conf, "prewarm-vllmwatch.log")
    try:
        start(d, "ready_cold")
        run.emit("prewarm", "cache_after_cold", cache2_mib=du_mib(cache),
                 compile_cache_mib=du_mib(cache / "vllm"), triton_mib=du_mib(cache / "triton"))
        run.pause(2)
        warm_restart(d, port, "tiny")
    finally:
        d.stop()


def big(run: Run) -> None:
    ensure_big(run)
    cache = run.work / "cache3"
    port = run.port(3)
    conf = big_config(run, "big", port, run.status_port(3), cache)
    run.emit("big", "start_cold", gpu=run.wait_idle_gpu(), cache3_mib=du_mib(cache))
    d = GpuDaemon(run, "big", conf, "big-vllmwatch.log")
    try:
        start(d, "ready_cold", timeout=480)
        run.emit("big", "completion", **completion(port, "q8b", max_tokens=16))
        run.pause(6)
        d.memory_view()
        run.emit("big", "cache_after_cold", compile_cache_mib=du_mib(cache / "vllm"),
                 triton_mib=du_mib(cache / "triton"))
        if run.left() > 150:
            warm_restart(d, port, "q8b")
        if run.left() > 150:
            inject_fault(d, "kill_engine", port, "q8b", find_titled("VLLM::EngineCore", d.pid),
                         signal.SIGKILL)
        else:
            run.emit("big", "skipped_kill", left_s=round(run.left()))
    finally:
        d.stop()
