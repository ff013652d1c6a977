"""Phases for issues 13 and 17 on the H200 machine(s), registered into drive.PHASES.

  matrix   8B-shaped model: cold start (fresh caches) and a warm restart (SIGUSR1) in one
           daemon, then a daemon with the kernel step on, then one without the warm-up request;
           each: READY, startup phases, TTFT of the first request after READY
  faults   8B-shaped model under one daemon: EngineCore SIGSTOP, API server SIGKILL (engine
           orphaned), a GPU leak injected into EngineCore (gpuleak/sitecustomize.py)
  tp2      tiny model, tensor-parallel 2 on GPUs 0,1: memory per GPU vs NVML, kill -9 of one
           TP worker, SIGSTOP of one TP worker
  pergpu   two daemons, tiny model, one per GPU; SIGUSR1 to one under load on the other
  pair     which shape (1/2): two daemons, 8B-shaped model, one per GPU, behind the load
           generator's round robin: throughput and latency at 16 and 128 clients, then
           kill -9 of one EngineCore under load (recovery, what clients saw)
  tp2big   which shape (2/2): one daemon, 8B-shaped model, tensor-parallel 2: the same loads;
           a GPU leak injected into Worker_TP1 (the growth rule on the tree's sum), kill -9
           of Worker_TP1 under load, kill -9 of EngineCore
  tp2api   tp2big's loads with two API server processes (--api-server-count 2), then kill -9
           of EngineCore under load
  tp2apikill  tp2api's faults only, eager: EngineCore kill -9, then APIServer_1 kill -9
  incident 8B-shaped model: EngineCore SIGSTOP (hang) -> the incident record (issue 25): which
           stack methods ran, EngineCore's innermost vLLM frames, how long the record delayed
           the SIGTERM; the record is copied to $OUT/incident/ (py-spy from the payload's
           vllmwatch-bin/, see vllm_h200.sh; without it only faulthandler runs, which a
           stopped EngineCore cannot answer: the record says so)

Every fault line records NVML before/after, the detect time (restart.begin after the fault),
the GPU release (gpu.released), READY again, and which processes of the old tree survived.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import drive as D  # the running driver module (drive.py registers itself under this name)
import loadgen as LG

PROMPT = ("The operator restarted the inference server after the nightly deploy, and the "
          "first user asked a long question about the weather in the mountains. ") * 12
HOOK_DIR = D.HERE / "gpuleak"
LEAK_TRIGGER = D.WORK / "gpuleak.trigger"


# ------------------------------------------------------------------------------- requests
def ttft(port: int, model: str, max_tokens: int = 16, timeout: float = 120) -> dict[str, Any]:
    """A streamed completion: seconds to the first token chunk and to the end."""
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True})
    t = time.monotonic()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        first, chunks = None, 0
        while True:
            line = r.readline()
            if not line:
                break
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                chunks += 1
                if first is None:
                    first = time.monotonic() - t
        conn.close()
        return {"status": r.status, "ttft_s": round(first, 4) if first else None,
                "total_s": round(time.monotonic() - t, 4), "chunks": chunks}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "after_s": round(time.monotonic() - t, 2)}


# ------------------------------------------------------------------------------ processes
def tree(d: D.Daemon) -> list[tuple[int, float, str]]:
    """(pid, start time, title) of every process under the daemon, the daemon excluded."""
    import psutil

    out = []
    for pid in D.descendants(d.p.pid):
        with contextlib.suppress(psutil.Error):
            out.append((pid, psutil.Process(pid).create_time(), D.title(pid)))
    return out


def survivors(old: list[tuple[int, float, str]]) -> list[dict[str, Any]]:
    """Processes of an old tree still alive (same pid and start time), zombies named."""
    import psutil

    left = []
    for pid, started, name in old:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if p.create_time() == started:
                left.append({"pid": pid, "title": name, "status": p.status()})
    return left


def leftovers_report(old: list[tuple[int, float, str]]) -> dict[str, Any]:
    """Survivors of the old tree at +1 s and +5 s (the resource tracker used to linger)."""
    time.sleep(1)
    at1 = survivors(old)
    if at1:
        time.sleep(4)
    return {"old_tree_size": len(old), "alive_after_1s": at1,
            "alive_after_5s": survivors(old) if at1 else []}


def events_after(d: D.Daemon, mark: int, t_fault: float, *names: str) -> dict[str, Any]:
    """First event of each name after the mark, its time relative to the fault."""
    out: dict[str, Any] = {}
    for name in names:
        evs = d.log.named(name, mark)
        if evs:
            e = evs[0]
            out[name] = {**{k: e.get(k) for k in ("reason", "detail", "code", "signal",
                                                  "message", "pids", "rule") if k in e},
                         "after_fault_s": round(e["t"] - t_fault, 2)}
    return out


def fault(d: D.Daemon, phase: str, what: str, port: int, model: str, target: int | None,
          sig: int, timeout: float = 420) -> None:
    """Send sig to target; report detect, release, READY again, survivors, NVML around it."""
    if target is None:
        D.emit(phase, what, error="target process not found",
               tree=[t for _, _, t in tree(d)])
        return
    old = tree(d)
    name = D.title(target)
    before = D.NV.snapshot()
    mark = d.log.count()
    t_fault = d.now()
    health: list[tuple[float, int | None]] = []
    stop = threading.Event()

    def watch_health() -> None:
        last: object = "x"
        while not stop.is_set():
            h = D.http("GET", f"http://127.0.0.1:{port}/health", timeout=1)[0]
            if h != last:
                health.append((round(d.now() - t_fault, 2), h))
                last = h
            time.sleep(0.2)

    os.kill(target, sig)
    th = threading.Thread(target=watch_health, daemon=True)
    th.start()
    idx, t_ready, ev = d.ready(mark, timeout=min(timeout, max(30.0, D.left() - 25)))
    stop.set()
    th.join(3)
    after = D.NV.snapshot()
    D.emit(phase, what, target_pid=target, target_title=name,
           target_alive=Path(f"/proc/{target}").exists(), signal=sig, gpu_before=before,
           gpu_at_ready=after, ready_again_after_fault_s=round(t_ready - t_fault, 2)
           if idx >= 0 and ev.get("event") == "child.ready" else None, ready_event=ev,
           events=events_after(d, mark, t_fault, "probe.failed", "child.exited",
                               "restart.begin", "child.stopping", "child.kill",
                               "leftovers.killed", "leftovers.remaining", "gpu.released",
                               "gpu.release_timeout", "child.started"),
           health=health[:12], old_tree=survivors(old),
           old_tree_size=len(old))
    if idx >= 0 and ev.get("event") == "child.ready":
        D.emit(phase, what + "_first_request", **ttft(port, model))


def stop_and_check(d: D.Daemon, sweep_after: bool = True) -> None:
    """SIGTERM the daemon, then: nothing of its tree left, every GPU back to idle."""
    old = tree(d)
    d.stop(sweep_after)
    D.emit(d.phase, "after_stop", **leftovers_report(old),
           gpu=D.wait_idle_gpu(30) if sweep_after else D.NV.snapshot())


def titled(prefix: str, root: int) -> int | None:
    """The process under root whose whole command line (its vLLM title) starts with prefix.
    (drive.find_titled also matches the 15-character comm, which cannot tell
    VLLM::Worker_TP1 from VLLM::Worker_TP0.)"""
    return next((pid for pid in D.descendants(root) if D.title(pid).startswith(prefix)), None)


# -------------------------------------------------------------------------------- phases
def start(d: D.Daemon, what: str, port: int, model: str, since: int = 0,
          timeout: float = 480) -> bool:
    idx, t, ev = d.ready(since, timeout=timeout)
    d.start_report(what, since, idx, t, ev)
    if idx < 0 or ev.get("event") != "child.ready":
        D.emit(d.phase, what + "_failed", event=ev)
        return False
    D.emit(d.phase, what + "_first_request", **ttft(port, model))
    D.emit(d.phase, what + "_second_request", **ttft(port, model))
    return True


def big_config(name: str, port: int, status_port: int, cache: Path,
               args: dict[str, Any] | None = None, **kw: Any) -> Path:
    return D.watch_config(name, D.BIG, "q8b", port, status_port, cache,
                          {"max-model-len": 8192, "gpu-memory-utilization": 0.90,
                           "dtype": "bfloat16", **(args or {})}, **kw)


def ensure_big() -> None:
    if not (D.BIG / ".complete").is_file():
        D.phase_biggen()


def phase_matrix() -> None:
    ensure_big()
    cache = D.WORK / "cache8b"
    shutil.rmtree(cache, ignore_errors=True)  # cold: nothing compiled yet
    runs = [("cold", {"kernels": False, "warmup_request": True}),
            ("kernels_on", {"kernels": True, "warmup_request": True}),
            ("no_warmup_request", {"kernels": False, "warmup_request": False})]
    for i, (name, kw) in enumerate(runs):
        if i and D.left() < 130:
            D.emit("matrix", "skipped", run=name, left_s=round(D.left()))
            continue
        conf = big_config(f"matrix-{name}", 8103, 9113, cache, **kw)
        D.emit("matrix", f"start_{name}", gpu=D.wait_idle_gpu(), cache_mib=D.du_mib(cache),
               **kw)
        d = D.Daemon("matrix", conf, f"matrix-{name}-vllmwatch.log")
        try:
            if not start(d, name, 8103, "q8b"):
                continue
            if i == 0:
                D.emit("matrix", "cache_after_cold", compile_cache_mib=D.du_mib(cache / "vllm"),
                       triton_mib=D.du_mib(cache / "triton"))
                old, mark, ts = tree(d), d.log.count(), d.now()
                d.p.send_signal(signal.SIGUSR1)  # warm restart: caches kept
                if start(d, "warm_restart", 8103, "q8b", since=mark):
                    D.emit("matrix", "warm_restart_breakdown",
                           sigusr1_to_ready_s=round(d.log.named("child.ready", mark)[0]["t"]
                                                    - ts, 2),
                           restart_begin=d.log.named("restart.begin", mark)[:1],
                           gpu_released=d.log.named("gpu.released", mark)[:1],
                           old_tree=survivors(old))
            if i == len(runs) - 1 and D.left() > 150:
                d.kill_engine(8103, "q8b")
        finally:
            stop_and_check(d)


def phase_faults() -> None:
    ensure_big()
    LEAK_TRIGGER.unlink(missing_ok=True)
    conf = big_config("faults", 8104, 9114, D.WORK / "cache8b",
                      env={"PYTHONPATH": str(HOOK_DIR),
                           "VLLMWATCH_GPU_LEAK_TRIGGER": str(LEAK_TRIGGER),
                           "VLLMWATCH_GPU_LEAK_MIB": "1024",
                           "VLLMWATCH_GPU_LEAK_STEPS": "8"},
                      memory='gpu_growth_limit = "4GiB"\nsustain = 3')
    D.emit("faults", "start", gpu=D.wait_idle_gpu())
    d = D.Daemon("faults", conf, "faults-vllmwatch.log")
    try:
        if not start(d, "ready", 8104, "q8b"):
            return
        time.sleep(6)  # baseline (baseline_delay 5 s)
        D.memory_view(d, "faults")
        fault(d, "faults", "engine_kill9", 8104, "q8b",
              D.find_titled("VLLM::EngineCore", d.p.pid), signal.SIGKILL)
        if D.left() > 150:
            fault(d, "faults", "engine_sigstop", 8104, "q8b",
                  D.find_titled("VLLM::EngineCore", d.p.pid), signal.SIGSTOP)
        if D.left() > 120:
            api = next((x for x in D.descendants(d.p.pid) if " serve " in f" {D.title(x)} "),
                       None)
            fault(d, "faults", "api_server_sigkill", 8104, "q8b", api, signal.SIGKILL)
        if D.left() > 120:
            time.sleep(6)  # a new baseline after the last restart
            mark, t0 = d.log.count(), d.now()
            engine = D.find_titled("VLLM::EngineCore", d.p.pid)
            LEAK_TRIGGER.write_text("go")
            idx, t_ready, _ = d.ready(mark, timeout=min(150.0, max(30.0, D.left() - 25)))
            D.emit("faults", "gpu_leak", engine_pid=engine,
                   events=events_after(d, mark, t0, "memory.rule_held", "memory.rule_fired",
                                       "restart.begin", "gpu.released", "gpu.release_timeout",
                                       "child.started"),
                   ready_again_after_trigger_s=round(t_ready - t0, 2) if idx >= 0 else None,
                   gpu_at_ready=D.NV.snapshot(), trigger_left=LEAK_TRIGGER.exists())
    finally:
        LEAK_TRIGGER.unlink(missing_ok=True)
        stop_and_check(d)


def tiny_args() -> dict[str, Any]:
    """Eager (no compile, no CUDA graphs): these phases test supervision, not start speed."""
    return {"max-model-len": 2048, "kv-cache-memory-bytes": D.TINY_KV, "dtype": "bfloat16",
            "enforce-eager": True}


def phase_tp2() -> None:
    D.ensure_tiny()
    conf = D.watch_config("tp2", D.TINY, "tiny", 8105, 9115, D.WORK / "cache-tp2",
                          {**tiny_args(), "tensor-parallel-size": 2}, gpus=(0, 1))
    D.emit("tp2", "start", gpu=D.wait_idle_gpu())
    d = D.Daemon("tp2", conf, "tp2-vllmwatch.log")
    try:
        if not start(d, "ready", 8105, "tiny"):
            return
        time.sleep(7)
        D.memory_view(d, "tp2")
        fault(d, "tp2", "worker_kill9", 8105, "tiny",
              titled("VLLM::Worker_TP1", d.p.pid), signal.SIGKILL)
        if D.left() > 150:
            time.sleep(3)
            fault(d, "tp2", "worker_sigstop", 8105, "tiny",
                  titled("VLLM::Worker_TP1", d.p.pid), signal.SIGSTOP)
    finally:
        stop_and_check(d)


def load(port: int, model: str, stop: threading.Event, out: dict[str, Any]) -> None:
    """Completions back to back until stop: counts of ok and failed, worst latency."""
    while not stop.is_set():
        r = D.completion(port, model, max_tokens=8, timeout=30)
        key = "ok" if r.get("status") == 200 else "failed"
        out[key] = out.get(key, 0) + 1
        out["worst_s"] = max(out.get("worst_s", 0.0), r["seconds"])
        if key == "failed" and len(out.setdefault("errors", [])) < 3:
            out["errors"].append(r)


def phase_pergpu() -> None:
    D.ensure_tiny()
    daemons = []
    for name, gpu, port in (("a", 0, 8106), ("b", 1, 8107)):
        conf = D.watch_config(f"pergpu-{name}", D.TINY, "tiny", port, 9116 + gpu,
                              D.WORK / f"cache-pergpu-{name}", tiny_args(), gpus=(gpu,))
        daemons.append((D.Daemon("pergpu", conf, f"pergpu-{name}-vllmwatch.log"), port))
    try:
        for (d, port), name in zip(daemons, "ab", strict=True):
            if not start(d, f"ready_{name}", port, "tiny"):
                return
        (a, _), (b, port_b) = daemons
        stop, stats = threading.Event(), dict[str, Any]()
        th = threading.Thread(target=load, args=(port_b, "tiny", stop, stats), daemon=True)
        th.start()
        before, mark, ts = D.NV.snapshot(), a.log.count(), a.now()
        a.p.send_signal(signal.SIGUSR1)
        idx, t, _ = a.ready(mark, timeout=min(300.0, max(30.0, D.left() - 25)))
        stop.set()
        th.join(40)
        D.emit("pergpu", "restart_a_while_b_serves", a_ready_again_s=round(t - ts, 2)
               if idx >= 0 else None, b_load=stats, gpu_before=before,
               gpu_after=D.NV.snapshot(), a_gpu_released=a.log.named("gpu.released", mark)[:1],
               b_restarts=b.log.named("restart.begin"))
    finally:  # no sweep until both are stopped: it would SIGKILL the other daemon's tree
        for i, (d, _) in enumerate(daemons):
            stop_and_check(d, sweep_after=i == len(daemons) - 1)


# ------------------------------------------------------------- which shape (issue 17 item 3)
LEVELS = (16, 128)   # total concurrent clients, the same for both shapes
LOAD_S, WARM_S = 30.0, 5.0


def measure_levels(phase: str, ports: list[int], model: str) -> None:
    """Closed-loop streamed load at each level: 128 tokens out per request (ignore_eos)."""
    for c in LEVELS:
        if D.left() < LOAD_S + 40:
            D.emit(phase, f"load_c{c}_skipped", left_s=round(D.left()))
            continue
        ld = LG.Load(ports, model, c).start()
        t0 = time.monotonic()
        time.sleep(LOAD_S)
        t1 = time.monotonic()
        recs = ld.stop()
        D.emit(phase, f"load_c{c}", concurrency=c, backends=len(ports), max_tokens=128,
               prompt_chars=len(LG.PROMPT), **LG.summary(recs, t0 + WARM_S, t1),
               gpu=D.NV.snapshot())


def fault_under_load(d: D.Daemon, phase: str, what: str, ports: list[int], model: str,
                     target: int | None, sig: int, clients: int = 16) -> None:
    """fault() while `clients` clients load every backend; then what they saw, from the
    fault until 10 s after READY again."""
    ld = LG.Load(ports, model, clients).start()
    time.sleep(8)
    t_fault = time.monotonic()
    fault(d, phase, what, ports[0], model, target, sig)
    time.sleep(10)
    t_end = time.monotonic()
    recs = ld.stop()
    D.emit(phase, what + "_clients", clients=clients, backends=len(ports),
           before_fault=LG.summary(recs, t_fault - 6, t_fault),
           after_fault=LG.outage(recs, t_fault, t_end))


def phase_pair() -> None:
    ensure_big()
    daemons = []
    for name, gpu in (("a", 0), ("b", 1)):
        conf = big_config(f"pair-{name}", 8108 + gpu, 9118 + gpu, D.WORK / f"cache8b-{name}",
                          gpus=(gpu,))
        daemons.append(D.Daemon("pair", conf, f"pair-{name}-vllmwatch.log"))
    D.emit("pair", "start", gpu=D.NV.snapshot())
    try:
        for i, d in enumerate(daemons):
            if not start(d, "ready_" + "ab"[i], 8108 + i, "q8b"):
                return
        time.sleep(6)
        for d in daemons:
            D.memory_view(d, "pair")
        measure_levels("pair", [8108, 8109], "q8b")
        if D.left() > 130:
            a = daemons[0]
            fault_under_load(a, "pair", "engine_kill9_a", [8108, 8109], "q8b",
                             D.find_titled("VLLM::EngineCore", a.p.pid), signal.SIGKILL)
            D.emit("pair", "b_restarts", events=daemons[1].log.named("restart.begin"))
    finally:  # no sweep until both are stopped: it would SIGKILL the other daemon's tree
        for i, d in enumerate(daemons):
            stop_and_check(d, sweep_after=i == len(daemons) - 1)


def phase_tp2big() -> None:
    ensure_big()
    LEAK_TRIGGER.unlink(missing_ok=True)
    conf = big_config("tp2big", 8110, 9120, D.WORK / "cache8b-tp2",
                      {"tensor-parallel-size": 2}, gpus=(0, 1),
                      env={"PYTHONPATH": str(HOOK_DIR),
                           "VLLMWATCH_GPU_LEAK_TRIGGER": str(LEAK_TRIGGER),
                           "VLLMWATCH_GPU_LEAK_TITLE": "VLLM::Worker_TP1",
                           "VLLMWATCH_GPU_LEAK_DEVICE": "cuda:1",
                           "VLLMWATCH_GPU_LEAK_MIB": "1024",
                           "VLLMWATCH_GPU_LEAK_STEPS": "8"},
                      memory='gpu_growth_limit = "4GiB"\nsustain = 3')
    D.emit("tp2big", "start", gpu=D.wait_idle_gpu())
    d = D.Daemon("tp2big", conf, "tp2big-vllmwatch.log")
    try:
        if not start(d, "ready", 8110, "q8b"):
            return
        time.sleep(6)
        D.memory_view(d, "tp2big")
        measure_levels("tp2big", [8110], "q8b")
        if D.left() > 110:
            mark, t0 = d.log.count(), d.now()
            worker = titled("VLLM::Worker_TP1", d.p.pid)
            before = D.NV.snapshot()
            LEAK_TRIGGER.write_text("go")
            idx, t_ready, _ = d.ready(mark, timeout=min(150.0, max(30.0, D.left() - 25)))
            D.emit("tp2big", "gpu_leak_in_worker_tp1", worker_pid=worker, gpu_before=before,
                   events=events_after(d, mark, t0, "memory.rule_held", "memory.rule_fired",
                                       "restart.begin", "gpu.released", "gpu.release_timeout",
                                       "child.started"),
                   ready_again_after_trigger_s=round(t_ready - t0, 2) if idx >= 0 else None,
                   gpu_at_ready=D.NV.snapshot(), trigger_left=LEAK_TRIGGER.exists(),
                   leak_lines=[ln for ln in d.log.lines if "[gpuleak]" in ln[1]][:10])
        if D.left() > 120:
            time.sleep(3)
            fault_under_load(d, "tp2big", "worker_tp1_kill9", [8110], "q8b",
                             titled("VLLM::Worker_TP1", d.p.pid), signal.SIGKILL)
        if D.left() > 110:
            fault(d, "tp2big", "engine_kill9", 8110, "q8b",
                  D.find_titled("VLLM::EngineCore", d.p.pid), signal.SIGKILL)
    finally:
        LEAK_TRIGGER.unlink(missing_ok=True)
        stop_and_check(d)


def phase_tp2api() -> None:
    """TP=2 with two API server processes (--api-server-count 2): is the single API server
    what held TP=2 at 128 clients (vLLM's stats said ~64 running of 128 sent)?"""
    ensure_big()
    conf = big_config("tp2api", 8111, 9121, D.WORK / "cache8b-tp2",
                      {"tensor-parallel-size": 2, "api-server-count": 2}, gpus=(0, 1))
    D.emit("tp2api", "start", gpu=D.wait_idle_gpu())
    d = D.Daemon("tp2api", conf, "tp2api-vllmwatch.log")
    try:
        if not start(d, "ready", 8111, "q8b"):
            return
        time.sleep(6)
        D.memory_view(d, "tp2api")
        measure_levels("tp2api", [8111], "q8b")
        if D.left() > 110:
            fault_under_load(d, "tp2api", "engine_kill9", [8111], "q8b",
                             D.find_titled("VLLM::EngineCore", d.p.pid), signal.SIGKILL)
    finally:
        stop_and_check(d)


def phase_tp2apikill() -> None:
    """tp2api's faults only, eager (a faster start; detection does not depend on compiling):
    EngineCore kill -9 under load (re-run after the engine-watch fix), then kill -9 of one of
    the two API server processes."""
    ensure_big()
    conf = big_config("tp2apikill", 8112, 9122, D.WORK / "cache8b-tp2e",
                      {"tensor-parallel-size": 2, "api-server-count": 2,
                       "enforce-eager": True}, gpus=(0, 1))
    D.emit("tp2apikill", "start", gpu=D.wait_idle_gpu())
    d = D.Daemon("tp2apikill", conf, "tp2apikill-vllmwatch.log")
    try:
        if not start(d, "ready", 8112, "q8b"):
            return
        time.sleep(6)
        fault_under_load(d, "tp2apikill", "engine_kill9", [8112], "q8b",
                         D.find_titled("VLLM::EngineCore", d.p.pid), signal.SIGKILL)
        if D.left() > 90:
            time.sleep(3)
            fault_under_load(d, "tp2apikill", "apiserver1_kill9", [8112], "q8b",
                             titled("VLLM::APIServer_1", d.p.pid), signal.SIGKILL)
    finally:
        stop_and_check(d)


def incident_summary(path: Path) -> dict[str, Any]:
    """What a record says in a few fields: methods, per process the dumps, the engine's
    innermost vLLM frames, the record's own time (also run here on CPU records: dry run)."""
    rec = json.loads((path / "record.json").read_text())
    procs = []
    for proc in rec["stacks"]["processes"]:
        dumps = {d["method"]: (d["ok"], d["error"][:160]) for d in proc["dumps"]}
        frames = [f"{f[0]} ({f[1]}:{f[2]})" for d in proc["dumps"] if d["ok"]
                  for t in d["threads"][:1] for f in t["frames"] if "vllm/" in str(f[1])]
        procs.append({"pid": proc["pid"], "role": proc["role"], "dumps": dumps,
                      "main_thread_vllm_frames": frames[:6]})
    return {"id": rec["id"], "reason": rec["reason"], "methods": rec["stacks"]["methods"],
            "processes": procs, "tree_note": rec["tree"]["note"],
            "record_s": rec["capture"]["seconds"], "versions": rec["versions"],
            "output_lines": len(rec["output"]), "metrics_series": len(rec["metrics"]["last"]
                                                                      or {})}


def phase_incident() -> None:
    ensure_big()
    state = D.WORK / "state-incident"
    shutil.rmtree(state, ignore_errors=True)
    spy = D.WORK / "site" / "vllmwatch-bin"  # py-spy, kept by vllm_h200.sh build
    old_env = {k: os.environ.get(k) for k in ("STATE_DIRECTORY", "PATH")}
    os.environ["STATE_DIRECTORY"] = str(state)  # the daemon inherits it: records land here
    os.environ["PATH"] = f"{spy}:{os.environ.get('PATH', '')}"
    conf = big_config("incident", 8105, 9115, D.WORK / "cache8b")
    D.emit("incident", "start", gpu=D.wait_idle_gpu(), py_spy=shutil.which("py-spy"))
    d = D.Daemon("incident", conf, "incident-vllmwatch.log")
    try:
        if not start(d, "ready", 8105, "q8b"):
            return
        time.sleep(8)  # a few /metrics scrapes for the record
        engine = D.find_titled("VLLM::EngineCore", d.p.pid)
        mark = d.log.count()
        fault(d, "incident", "engine_sigstop", 8105, "q8b", engine, signal.SIGSTOP)
        recs = d.log.named("incident.recorded", mark)
        begins = d.log.named("restart.begin", mark)
        stops = d.log.named("child.stopping", mark)
        if not recs:
            D.emit("incident", "no_record", failed=d.log.named("incident.failed", mark),
                   timeout=d.log.named("incident.timeout", mark))
            return
        path = Path(recs[0]["incident_path"])
        dest = D.OUT / "incident" / path.name
        shutil.copytree(path, dest, dirs_exist_ok=True)
        D.emit("incident", "record", copied_to=str(dest), stacks=recs[0].get("stacks"),
               restart_to_record_s=round(recs[0]["t"] - begins[0]["t"], 3) if begins else None,
               restart_to_sigterm_s=round(stops[0]["t"] - begins[0]["t"], 3)
               if begins and stops else None, **incident_summary(path))
    finally:
        stop_and_check(d)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


D.PHASES.update(matrix=phase_matrix, faults=phase_faults, tp2=phase_tp2, pergpu=phase_pergpu,
                pair=phase_pair, tp2big=phase_tp2big, tp2api=phase_tp2api,
                tp2apikill=phase_tp2apikill, incident=phase_incident)
D.ORDER[:] = ["probe", "matrix", "faults", "tp2", "pergpu", "pair", "tp2big", "tp2api",
              "tp2apikill", "incident"]
D.EST.update(probe=60, matrix=400, faults=300, tp2=200, pergpu=150, pair=320, tp2big=500,
               tp2api=350, tp2apikill=250, incident=260)
