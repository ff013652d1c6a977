"""Issue 33's phases: vLLM's own start-up caches (startup plan, mega AOT artifact), 8B shape.

  cachesplain plain `vllm serve` starts, in order: empty caches and start-up caches off, the
              run's cold start (the reference); n x neither; the plan's writing start
              (reported apart), n x plan only; the artifact's writing start (reported apart:
              the artifact is part of the compile-cache key, so it compiles once more), n x
              artifact only, n x both; greedy outputs of every configuration compared. It
              stops before a start that no longer fits the call and goes on from there when
              named again in the next call (WORK/caches-ref.json keeps what is done)
  cacheson    vllmwatch with the caches on (prewarm.startup_plan auto, mega_aot_artifact
              true): EngineCore kill -9, API server SIGKILL, GPU leak, SIGUSR1
  cachesoff   the same four faults with both switches off
  cachesprep  the ground of one measuring call (cacheson cachesoff): empty caches, the
              run's cold start (the reference; it writes the compile cache cachesoff
              reads), then the writing start of both caches (reported apart)

Greedy outputs are compared as token ids (`return_token_ids`, `ignore_eos`: GREEDY_TOKENS
ids per prompt), never as text alone: the random-weight model's ids decode to "".

A plain start is `vllm serve` with the environment and flags vllmwatch itself builds for the
same config (vllmwatch.config.command.build, the start-up cache variables from
config/startcaches.py), so the plain starts and the daemon's share one compile cache and one
plan (all under WORK/cache8b-caches). Launch -> READY is launch -> the first greedy completion
of the bench's prompts; each start line carries the reuse fields read from vLLM's own lines
(vllmwatch.core.reuse), the cold start's seconds and the ratio to it. The daemon phases'
restart_timing lines carry child.ready's `reuse` and `compile_cache_hit` (phases/standby.py).
The cold start, the samples and every configuration's greedy texts are kept in
WORK/caches-ref.json, so a later device call goes on from and compares with an earlier one's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from bench.gpu.calls import completion, greedy_ids, health
from bench.gpu.config import big_config, du_mib
from bench.gpu.daemon import GpuDaemon, LineNotes
from bench.gpu.inject import leak_env, serving
from bench.gpu.models import ensure_big
from bench.gpu.phases.standby import FAULTS, LEAK_LIMIT, _fault, stable_after, timed
from bench.gpu.run import Run
from vllmwatch.config import command, startcaches, vllminfo
from vllmwatch.config.schema import load
from vllmwatch.core import reuse
from vllmwatch.prewarm.runner import cache_env, compile_cache_hit

N = 3  # plain restarts per configuration
PROMPTS = ("The capital of France is", "def fibonacci(n):",
           "Three things to check before restarting a server:")
GREEDY_TOKENS = 24
# (plan, artifact) switches of each configuration: "auto" leaves the artifact to vLLM's
# default (off with torch < 2.12, the H200 image's 2.11).
CONFIGS: dict[str, tuple[bool | str, bool | str]] = {
    "neither": (False, "auto"), "plan": (True, "auto"), "artifact": (False, True),
    "both": (True, True)}
CACHE = "cache8b-caches"


def _cache(run: Run) -> Path:
    return run.work / CACHE


def _ref_path(run: Run) -> Path:
    return run.work / "caches-ref.json"


def _ref(run: Run) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(_ref_path(run).read_text())
        return data
    except (OSError, ValueError):
        return {}


def _save_ref(run: Run, **fields: Any) -> None:
    _ref_path(run).write_text(json.dumps({**_ref(run), **fields}, indent=1))


def _conf(run: Run, phase: str, n: int, plan: bool | str, art: bool | str) -> Path:
    trigger = run.work / f"{phase}.trigger"  # the same variables as the daemon phases
    return big_config(run, phase, run.port(n), run.status_port(n), _cache(run),
                      env=leak_env(trigger), memory=LEAK_LIMIT, shipped_probe=True,
                      prewarm={"startup_plan": plan, "mega_aot_artifact": art})


def plain_command(conf_path: Path) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """argv and environment of `vllm serve` as vllmwatch would launch it for this config."""
    conf = load(str(conf_path))
    info = vllminfo.info(conf.vllm.command)
    decision = startcaches.decide(conf, os.environ, info, unified=False)
    extra = {**cache_env(conf, os.environ), **decision.env}
    cmd = command.build(conf, os.environ, vllm_version=info.version, extra_env=extra)
    return list(cmd.argv), dict(cmd.env), {"start_caches_env": decision.env,
                                           "why": decision.why, "vllm": info.version,
                                           "torch": info.torch}


def plain_start(run: Run, phase: str, label: str, i: int, plan: bool | str,
                art: bool | str, port_n: int) -> dict[str, Any]:
    """One plain `vllm serve` from launch to READY (the first greedy completion), its reuse
    and greedy texts, then SIGTERM."""
    argv, env, decided = plain_command(_conf(run, f"{phase}-{label}", port_n, plan, art))
    port = run.port(port_n)
    gpu = run.wait_idle_gpu()
    t0 = time.monotonic()
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    run.own(p.pid)
    notes = LineNotes(run.logs / f"{phase}-{label}-{i}-vllm.log", t0)
    facts: dict[str, Any] = {}
    hit = [False]
    assert p.stdout is not None
    out = p.stdout

    def read() -> None:
        nonlocal facts
        for raw in iter(out.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            notes.note(time.monotonic(), line, line)
            facts = reuse.merge(facts, reuse.facts_of(line))
            hit[0] = hit[0] or compile_cache_hit(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    rec: dict[str, Any] = {"config": label, "i": i, **decided, "gpu_before": gpu}
    try:
        ready_s, greedy = _until_ready(run, p, port, t0)
        rec.update(launch_to_ready_s=ready_s, **greedy, exit_code=p.poll(),
                   milestones_s=notes.first, compile_cache_hit=hit[0], reuse=dict(facts),
                   reuse_line=reuse.one_line(facts, hit[0]))
    finally:
        rec["stop"] = _stop(run, p)
        reader.join(5)
        notes.close()
    cold = _ref(run).get("cold_s")
    if isinstance(cold, float) and rec.get("launch_to_ready_s"):
        rec.update(cold_s=cold, x_cold=round(rec["launch_to_ready_s"] / cold, 3))
    rec["cache_mib"] = du_mib(_cache(run))
    run.emit(phase, "plain_start", **rec)
    return rec


def _until_ready(run: Run, p: subprocess.Popen[bytes], port: int, t0: float
                 ) -> tuple[float | None, dict[str, Any]]:
    """Seconds from launch to the first greedy completion, then PROMPTS' greedy outputs."""
    end = t0 + min(480.0, run.left() - 20)
    while time.monotonic() < end and p.poll() is None:
        if health(port, timeout=2) == 200:
            first = completion(port, "q8b", PROMPTS[0], GREEDY_TOKENS, timeout=60)
            if first.get("status") == 200:
                return round(time.monotonic() - t0, 2), greedy(port)
        time.sleep(0.1)
    return None, {"texts": [], "ids": []}


def greedy(port: int) -> dict[str, Any]:
    """The greedy texts and token ids of PROMPTS, GREEDY_TOKENS ids each."""
    got = [greedy_ids(port, "q8b", q, GREEDY_TOKENS) for q in PROMPTS]
    return {"texts": [g.get("text") for g in got], "ids": [g.get("ids") for g in got]}


def _keep_greedy(run: Run, label: str, got: dict[str, Any]) -> None:
    ref = _ref(run)
    _save_ref(run, texts={**ref.get("texts", {}), label: got.get("texts")},
              ids={**ref.get("ids", {}), label: got.get("ids")})


def _stop(run: Run, p: subprocess.Popen[bytes]) -> dict[str, Any]:
    ts = time.monotonic()
    with contextlib.suppress(OSError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        code = p.wait(40)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(p.pid, signal.SIGKILL)
        code = p.wait(10)
    left = run.sweep("caches")
    return {"exit_code": code, "seconds": round(time.monotonic() - ts, 2),
            "left_killed": len(left)}


# The plain starts in order: (configuration, i); i = 0 is the cold start or a writing start
# (reported apart, never a sample). The series resumes where the last call stopped.
STEPS: tuple[tuple[str, int], ...] = (
    ("cold", 0), *(("neither", i) for i in range(1, N + 1)),
    ("plan-writing", 0), *(("plan", i) for i in range(1, N + 1)),
    ("artifact-writing", 0), *(("artifact", i) for i in range(1, N + 1)),
    *(("both", i) for i in range(1, N + 1)),
)
NEED_S = {0: 150.0, 1: 80.0}  # time a start needs, cold or writing (i = 0) / warm, with stop


def cachesplain(run: Run) -> None:
    """The plain starts of STEPS not yet done in this run (WORK/caches-ref.json), in order,
    while each still fits; then the configurations' summaries and the greedy comparison."""
    ensure_big(run)
    if not _ref(run).get("done"):  # a new run: empty caches, the cold start is the reference
        shutil.rmtree(_cache(run), ignore_errors=True)
        _ref_path(run).unlink(missing_ok=True)
    for label, i in STEPS:
        key = f"{label}-{i}"
        if key in _ref(run).get("done", []):
            continue
        need = NEED_S[min(i, 1)]
        if not run.dry and run.left() < need:
            run.emit("cachesplain", "paused", next=key, left_s=round(run.left()), needs_s=need,
                     detail="run `drive cachesplain` again: it goes on from here")
            return
        plan, art = CONFIGS["neither" if label == "cold" else label.removesuffix("-writing")]
        rec = plain_start(run, "cachesplain", label, i, plan, art, 30)
        if not rec.get("launch_to_ready_s"):
            run.emit("cachesplain", "failed_start", config=label, i=i)
            return
        if label == "cold":
            _save_ref(run, cold_s=float(rec["launch_to_ready_s"]))
            run.emit("cachesplain", "cold_reference", cold_s=rec["launch_to_ready_s"],
                     cache_mib=du_mib(_cache(run)))
        ref = _ref(run)
        samples = ref.get("samples", {})
        if i > 0:
            samples[label] = [*samples.get(label, []),
                              {"s": rec["launch_to_ready_s"], "reuse": rec.get("reuse_line")}]
        _save_ref(run, done=[*ref.get("done", []), key], samples=samples)
        _keep_greedy(run, label, rec)
    for label in CONFIGS:
        _summary(run, "cachesplain", label, _ref(run).get("samples", {}).get(label, []))
    greedy_check(run, "cachesplain")


def _summary(run: Run, phase: str, label: str, got: list[dict[str, Any]]) -> None:
    secs = sorted(r["s"] for r in got if r.get("s"))
    cold = _ref(run).get("cold_s")
    med = secs[len(secs) // 2] if secs else None
    run.emit(phase, "config_summary", config=label, n=len(secs), launch_to_ready_s=secs,
             median_s=med, cold_s=cold,
             median_x_cold=round(med / cold, 3) if med and isinstance(cold, float) else None,
             reuse=[r.get("reuse") for r in got])


def greedy_check(run: Run, phase: str) -> bool:
    """Greedy outputs of the same prompts equal with and without the caches, as token ids:
    equal only when at least two starts were compared and every one of them gave
    GREEDY_TOKENS ids for each prompt (an empty or missing output fails the check)."""
    ref = _ref(run)
    ids: dict[str, Any] = ref.get("ids", {})
    full = sorted(k for k, v in ids.items() if _full(v))
    distinct = {json.dumps(v) for v in ids.values()}
    same = len(ids) >= 2 and len(full) == len(ids) and len(distinct) == 1
    run.emit(phase, "greedy_equal", equal=same, compared=sorted(ids), full=full,
             distinct=len(distinct), tokens_each=GREEDY_TOKENS, ids=ids,
             texts=ref.get("texts", {}))
    return same


def _full(ids: Any) -> bool:
    """One list of exactly GREEDY_TOKENS integer ids per prompt."""
    return (isinstance(ids, list) and len(ids) == len(PROMPTS)
            and all(isinstance(one, list) and len(one) == GREEDY_TOKENS
                    and all(isinstance(i, int) for i in one) for one in ids))


def _daemon(run: Run, phase: str, n: int, plan: bool | str, art: bool | str) -> None:
    ensure_big(run)
    trigger = run.work / f"{phase}.trigger"
    trigger.unlink(missing_ok=True)
    port, status_port = run.port(n), run.status_port(n)
    setting = True if run.dry else "auto"  # the fake's CPU config: force the standby there
    conf = big_config(run, phase, port, status_port, _cache(run), env=leak_env(trigger),
                      memory=LEAK_LIMIT, shipped_probe=True, shipped_drain=True,
                      restart={"standby": setting,
                               "stable_after": f"{stable_after(run):.0f}s"},
                      prewarm={"startup_plan": plan, "mega_aot_artifact": art})
    run.emit(phase, "start", gpu=run.wait_idle_gpu(), cache_mib=du_mib(_cache(run)),
             startup_plan=plan, mega_aot_artifact=art, cold_s=_ref(run).get("cold_s"))
    d = GpuDaemon(run, phase, conf, f"{phase}-vllmwatch.log")
    try:
        if not serving(d, "ready", port, "q8b"):
            return
        first = d.named("child.ready")[:1]
        run.emit(phase, "first_launch", reuse=first[0].get("reuse") if first else None,
                 caches=d.named("prewarm.start_caches"))
        _keep_greedy(run, phase, greedy(port))
        relaunch: dict[str, float | None] = {}
        for what in FAULTS:
            if run.left() < 90:
                run.emit(phase, "skipped", fault=what, left_s=round(run.left()))
                continue
            mark = d.count()
            timed(d, what, status_port, _fault(d, what, port, trigger))
            begin, ready = d.named("restart.begin", mark), d.named("child.ready", mark)
            relaunch[what] = (round(ready[0]["t"] - begin[0]["t"], 2) if begin and ready
                              else None)
            run.emit(phase, "relaunch_segments", fault=what, seconds=segments(d, mark))
        if d.named("child.ready")[1:]:  # the relaunched child's outputs (after the last fault)
            _keep_greedy(run, f"{phase}-relaunched", greedy(port))
        _save_ref(run, relaunch={**_ref(run).get("relaunch", {}), phase: relaunch})
        _x_cold(run, phase, d)
        side_by_side(run, phase)
        run.emit(phase, "status_at_end", status={k: d.status().get(k) for k in (
            "launches", "start_phases_s", "start_reuse", "restarts_by_reason")})
    finally:
        trigger.unlink(missing_ok=True)
        d.stop_and_check()


def _x_cold(run: Run, phase: str, d: GpuDaemon) -> None:
    """Each relaunch's restart.begin -> child.ready over the run's cold start."""
    cold = _ref(run).get("cold_s")
    begins, readies = d.named("restart.begin"), d.named("child.ready")[1:]
    rows = [{"reason": b.get("reason"), "begin_to_ready_s": round(r["t"] - b["t"], 2),
             "x_cold": round((r["t"] - b["t"]) / cold, 3) if isinstance(cold, float) else None,
             "reuse": r.get("reuse"), "compile_cache_hit": r.get("compile_cache_hit")}
            for b, r in zip(begins, readies, strict=False)]
    secs = sorted(row["begin_to_ready_s"] for row in rows)
    run.emit(phase, "relaunch_summary", cold_s=cold, relaunches=rows,
             median_s=secs[len(secs) // 2] if secs else None,
             cache_missed=d.named("startup.cache_missed"))


# vLLM's own lines that end each segment of a relaunch, in order (docs/GPU.md section 12).
SEGMENTS = (("process_cuda_init", "Loading model from scratch"),
            ("weights", "Loading weights took"), ("post_load", "Model loading took"),
            ("torch_compile", "torch.compile took"), ("kv", "GPU KV cache size"),
            ("cuda_graphs", "Graph capturing finished"), ("engine_tail", "init engine ("),
            ("api_server", "Application startup complete"))


def segments(d: GpuDaemon, mark: int) -> dict[str, float]:
    """Where one relaunch's seconds went: restart.begin -> child.started, then from one of
    vLLM's SEGMENTS lines to the next (a line vLLM did not print is left out), then to
    child.ready (the canary)."""
    begin, started = d.named("restart.begin", mark), d.named("child.started", mark)
    ready = d.named("child.ready", mark)
    if not (begin and started and ready):
        return {}
    prev, end = started[0]["t"], ready[0]["t"]
    lines = [(e["t"], str(e.get("text", ""))) for e in d.named("child.line", mark)]
    out = {"begin_to_launch": round(prev - begin[0]["t"], 2)}
    for name, needle in SEGMENTS:
        at = next((t for t, text in lines if needle in text and prev <= t <= end), None)
        if at is not None:
            out[name] = round(at - prev, 2)
            prev = at
    out["canary"] = round(end - prev, 2)
    out["total"] = round(end - begin[0]["t"], 2)
    return out


def side_by_side(run: Run, phase: str) -> None:
    """Once both daemon phases ran in this run: each fault's restart.begin -> READY with the
    caches on and off, and issue 33's three bars against the run's cold start."""
    ref = _ref(run)
    on, off = (ref.get("relaunch", {}).get(p) for p in ("cacheson", "cachesoff"))
    if not on or not off:
        return
    cold = ref.get("cold_s")
    rows = []
    for what in FAULTS:
        a, b = on.get(what), off.get(what)
        rows.append({"fault": what, "on_s": a, "off_s": b,
                     "faster_by_s": round(b - a, 2) if a is not None and b is not None else None,
                     "on_x_cold": round(a / cold, 3) if a and isinstance(cold, float) else None})
    got = sorted(r["on_s"] for r in rows if r["on_s"] is not None)
    med = (got[(len(got) - 1) // 2] + got[len(got) // 2]) / 2 if got else None
    ok = len(got) == len(FAULTS) and isinstance(cold, float) and med is not None
    run.emit(phase, "caches_side_by_side", cold_s=cold, rows=rows,
             on_median_s=round(med, 2) if med is not None else None,
             each_le_0_2_cold=ok and all(r["on_x_cold"] <= 0.2 for r in rows),
             median_le_0_15_cold=ok and isinstance(cold, float) and med is not None
             and med <= 0.15 * cold,
             each_7s_faster=all(r["faster_by_s"] is not None and r["faster_by_s"] >= 7
                                for r in rows))


def cachesprep(run: Run) -> None:
    """The ground of one measuring call (`drive cacheson cachesoff`), run in the install
    call: caches emptied, the run's cold start (start-up caches off: the reference; it writes
    the compile cache that cachesoff reads), then the writing start of the plan and the
    artifact together (reported apart: the artifact is in the compile-cache key, so it
    compiles once more), so that every launch of the daemon phases reads warm caches."""
    ensure_big(run)
    shutil.rmtree(_cache(run), ignore_errors=True)
    _ref_path(run).unlink(missing_ok=True)
    for label, (plan, art) in (("cold", CONFIGS["neither"]), ("both-writing", CONFIGS["both"])):
        if not run.dry and run.left() < NEED_S[0]:
            run.emit("cachesprep", "failed_start", config=label, left_s=round(run.left()),
                     detail="not enough time left in this call: give cachesprep a bigger budget")
            return
        rec = plain_start(run, "cachesprep", label, 0, plan, art, 30)
        if not rec.get("launch_to_ready_s"):
            run.emit("cachesprep", "failed_start", config=label, i=0)
            return
        if label == "cold":
            _save_ref(run, cold_s=float(rec["launch_to_ready_s"]))
            run.emit("cachesprep", "cold_reference", cold_s=rec["launch_to_ready_s"],
                     cache_mib=du_mib(_cache(run)))
        _keep_greedy(run, label, rec)
    greedy_check(run, "cachesprep")


def cacheson(run: Run) -> None:
    _daemon(run, "cacheson", 32, True if run.dry else "auto", True)
    greedy_check(run, "cacheson")


def cachesoff(run: Run) -> None:
    _daemon(run, "cachesoff", 33, False, "auto")
    greedy_check(run, "cachesoff")
