"""Startup (issue 5): time to READY of the real CPU vLLM through vllmwatch.

    .venv/bin/python -m bench.startup [--runs 3] [--part compile,pagecache]

compile:   WITHOUT --enforce-eager. Cold = a new empty prewarm.cache_dir (so VLLM_CACHE_ROOT,
           TRITON_CACHE_DIR, ... point at empty dirs); warm = the same dir again right after.
           Pairs cold_i, warm_i alternate. compile_cache_hit comes from child.ready.
pagecache: WITH --enforce-eager (little to compile; one cache dir for all runs). Before
           each start the weight files are evicted from the page cache (pagecache.evict); then
           either prewarm.page_cache = false (the start reads them from disk) or true
           (vllmwatch reads them back before the launch). Alternated.
READY = vllmwatch's child.ready (health 200 + a real completion + warm-up request), its
startup_s is measured from the spawn; prewarm time before the spawn is reported apart.
Writes bench/results/startup.json.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import (
    MODEL,
    RESULTS,
    Watch,
    cleanup_at_exit,
    free_port,
    machine,
    save,
    say,
    stats,
    write_config,
)
from vllmwatch.prewarm import pagecache

MODEL_DIR = Path(MODEL)  # VLLMWATCH_BENCH_MODEL overrides the tiny model


def one_start(tag: str, cache: Path, eager: bool, page_cache: bool) -> dict[str, Any]:
    port, sport = free_port(), free_port()
    tmp = Path(tempfile.mkdtemp(prefix="vw-startup-"))
    cfg = write_config(tmp / "vw.toml", port, sport, cache, eager=eager,
                       sections={"prewarm": {"cache_dir": str(cache),
                                             "page_cache": page_cache}})
    w = Watch(cfg, RESULTS / "logs" / f"startup-{tag}.jsonl")
    t0 = time.monotonic()
    res: dict[str, Any] = {"tag": tag}
    rdy = None
    try:
        rdy = w.wait_event("child.ready", t0, 400)
        started = w.wait_event("child.started", t0, 1)
        steps = {e.get("step"): {"status": e.get("status"), "seconds": e.get("seconds"),
                                 "detail": str(e.get("detail"))[:120]}
                 for _, e in w.since(t0, "prewarm.step")}
        if rdy is None:
            res.update({"error": "not ready in 400 s", "prewarm": steps})
        else:
            e = rdy[1]
            res.update({"startup_s": e.get("startup_s"), "total_s": round(rdy[0] - t0, 2),
                        "prewarm_s": round(started[0] - t0, 2) if started else None,
                        "compile_cache_hit": e.get("compile_cache_hit"),
                        "phases": e.get("phases"), "prewarm": steps})
    finally:
        w.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        if rdy is not None:
            res.update(from_log(RESULTS / "logs" / f"startup-{tag}.jsonl"))
    return res


_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")


def from_log(log: Path) -> dict[str, Any]:
    """vLLM's own figures from the forwarded child lines: engine init time, cache reuse."""
    out: dict[str, Any] = {"engine_init_s": None, "compile_cache_load_failed": False,
                           "compile_cache_loaded": False}
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            if '"child.line"' not in line:
                continue
            m = _INIT.search(line)
            if m:
                out["engine_init_s"] = float(m.group(1))
            if "Compiling model again due to a load failure" in line:
                out["compile_cache_load_failed"] = True
            if "Directly load the compiled graph" in line or "loaded AOT compiled" in line:
                out["compile_cache_loaded"] = True
    return out


def du_mib(path: Path) -> float:
    total = 0
    for p in path.rglob("*"):
        if p.is_file():
            total += p.stat().st_size
    return round(total / 2**20, 2)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--part", default="compile,pagecache")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="vw-startup-caches-"))
    out: dict[str, Any] = {"machine": machine(), "args": vars(args)}
    parts = args.part.split(",")
    try:
        if "compile" in parts:
            rows: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": []}
            for i in range(args.runs):
                cache = base / f"compile-{i}"
                for kind in ("cold", "warm"):
                    say(f"compile {kind} {i + 1}")
                    r = one_start(f"compile-{kind}-{i}", cache, eager=False, page_cache=True)
                    r["cache_mib_after"] = du_mib(cache)
                    say("  ", {k: r.get(k) for k in ("startup_s", "compile_cache_hit",
                                                     "cache_mib_after", "error")})
                    rows[kind].append(r)
                    out["compile"] = rows
                    save("startup", out)
            out["compile_summary"] = summary(rows, "cold", "warm")
            save("startup", out)
        if "pagecache" in parts:
            cache = base / "eager"
            weights = pagecache.weight_files(MODEL_DIR)
            out["weights_bytes"] = sum(p.stat().st_size for p in weights)
            prow: dict[str, list[dict[str, Any]]] = {"evicted": [], "evicted+prewarm": []}
            for i in range(args.runs):
                for kind, warm in (("evicted", False), ("evicted+prewarm", True)):
                    pagecache.evict(weights)
                    res_before = pagecache.residency(weights)
                    say(f"pagecache {kind} {i + 1} (residency before {res_before})")
                    r = one_start(f"pagecache-{kind}-{i}", cache, eager=True, page_cache=warm)
                    r["residency_before"] = res_before
                    say("  ", {k: r.get(k) for k in ("startup_s", "prewarm_s", "error")})
                    prow[kind].append(r)
                    out["pagecache"] = prow
                    save("startup", out)
            out["pagecache_summary"] = summary(prow, "evicted", "evicted+prewarm")
            save("startup", out)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


def summary(rows: dict[str, list[dict[str, Any]]], a: str, b: str) -> dict[str, Any]:
    s: dict[str, Any] = {}
    for k, v in rows.items():
        s[k] = {"startup_s": stats([r["startup_s"] for r in v if r.get("startup_s")]),
                "engine_init_s": stats([r["engine_init_s"] for r in v
                                        if r.get("engine_init_s")]),
                "total_s": stats([r["total_s"] for r in v if r.get("total_s")]),
                "compile_cache_hit": [r.get("compile_cache_hit") for r in v]}
    ma, mb = s[a]["startup_s"].get("median"), s[b]["startup_s"].get("median")
    if ma and mb:
        s[f"ratio_{a}_over_{b}"] = round(ma / mb, 2)
    return s


if __name__ == "__main__":
    cleanup_at_exit()
    sys.exit(main())
