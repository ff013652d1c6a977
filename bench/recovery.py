"""Recovery: time to detect and time until /v1/completions answers again, per fault.

    .venv/bin/python -m bench.recovery [--who vllmwatch,systemd,cron] [--runs 3]
        [--faults engine_kill,hang,api_kill,leak,crash_start] [--cron-period 30]

Faults, injected into a real CPU vLLM (crash_start: the fake vLLM, see bench/_flaky_start.py):
  engine_kill  SIGKILL to VLLM::EngineCore
  hang         SIGSTOP to EngineCore and its Worker (health keeps answering 200)
  api_kill     SIGKILL to the API server (EngineCore/Worker become orphans)
  leak         the API server allocates LEAK_MIB of memory it never frees
               (bench/leakhook/sitecustomize.py, through PYTHONPATH)
  crash_start  the first launch exits 1 one second into its start
Supervisors:
  vllmwatch    `vllmwatch run`, shipped defaults except: memory.host_limit (the leak rule),
               restart.stable_after=20s (each fault counts as the first failure after a
               stable period, i.e. faults > 10 min apart) and max_restarts=50.
  systemd      bench/restart_on_failure.py: Restart=on-failure, RestartSec=10.
  cron         bench/cron_check.py with --cron-period (scale to 5 min: detection is uniform
               over the period, mean period/2).
Detect = first reaction of the supervisor (restart.begin, exited, kill/relaunch) after the
fault. Recovered = first 200 from a 1-token completion (polled every 0.5 s, 2 s timeout) from
a new server process. Writes bench/results/recovery.json (merged across invocations).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench._common import (
    PY,
    REPO,
    RESULTS,
    Watch,
    cleanup_at_exit,
    find_in_tree,
    free_port,
    machine,
    save,
    say,
    stats,
    vllm_argv,
    wait_completion,
    write_config,
)

# The tiny vLLM tree: ~2900 MiB RSS / ~2400 MiB PSS when healthy. The leak must take PSS
# (what vllmwatch's host rule watches) clearly over the limit: 1200 on top of 3500 did not.
LEAK_MIB = 1500
HOST_LIMIT_MIB = 3300
REAL_FAULTS = ("engine_kill", "hang", "api_kill", "leak")


def inject(fault: str, root: int, trigger: Path) -> None:
    if fault == "engine_kill":
        for p in find_in_tree(root, "VLLM::EngineCore"):
            os.kill(p.pid, signal.SIGKILL)
    elif fault == "hang":
        procs = find_in_tree(root, "VLLM::EngineCore")
        for p in procs:
            for q in [p, *p.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    q.suspend()
    elif fault == "api_kill":
        os.kill(root, signal.SIGKILL)
    elif fault == "leak":
        trigger.write_text("leak")
    else:
        raise ValueError(fault)


def listeners(port: int) -> list[str]:
    out = []
    with contextlib.suppress(psutil.Error):
        for c in psutil.net_connections("tcp"):
            if c.laddr and c.laddr.port == port and c.status == "LISTEN" and c.pid:
                with contextlib.suppress(psutil.Error):
                    out.append(f"{c.pid}:{' '.join(psutil.Process(c.pid).cmdline())[:40]}")
    return out


def group_pids(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if os.getpgid(p.pid) == pgid:
                out.append(p.pid)
    return out


def cmdlines(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out.append(" ".join(psutil.Process(pid).cmdline())[:30] or f"{pid} <zombie>")
    return out


def group_rss_mib(pgid: int) -> float:
    total = 0
    for pid in group_pids(pgid):
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_info().rss
    return round(total / 2**20)


def wait_new_server(w: Watch, old: int, t0: float, timeout: float) -> float | None:
    """Time of the first completion answered by a server other than `old`."""
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        pid = w.child_pid()
        if pid is not None and pid != old:
            break
        if w.proc.poll() is not None:
            return None
        time.sleep(0.1)
    else:
        return None
    return wait_completion(w.port, max(1.0, deadline - time.monotonic()))


def wait_serving(w: Watch, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = w.child_pid()
        if pid and wait_completion(w.port, 2, every=0.5):
            return pid
        if w.proc.poll() is not None:
            return None
        time.sleep(1)
    return None


# ---------------------------------------------------------------- vllmwatch


def run_vllmwatch(faults: list[str], runs: int, tmp: Path, timeout: float) -> dict[str, Any]:
    res: dict[str, Any] = {}
    real = [f for f in faults if f in REAL_FAULTS]
    if real:
        port, sport = free_port(), free_port()
        trigger = tmp / "leak-trigger"
        cfg = write_config(
            tmp / "vw.toml", port, sport, tmp / "cache",
            env={"PYTHONPATH": str(REPO / "bench" / "leakhook"),
                 "VLLMWATCH_BENCH_LEAK_TRIGGER": str(trigger),
                 "VLLMWATCH_BENCH_LEAK_MIB": str(LEAK_MIB)},
            sections={"memory": {"host_limit": f"{HOST_LIMIT_MIB}MiB"},
                      "restart": {"stable_after": "20s", "max_restarts": 50}})
        w = Watch(cfg, RESULTS / "logs" / "recovery-vllmwatch.jsonl")
        w.port = port
        try:
            for fault in real:
                rows = []
                for i in range(runs):
                    root = wait_serving(w, 300)
                    if root is None:
                        say("vllmwatch: server not serving; stop")
                        break
                    ready = w.since(0, "child.ready")
                    since_ready = time.monotonic() - (ready[-1][0] if ready else 0)
                    time.sleep(max(0.0, 25 - since_ready) + random.uniform(0, 5))
                    root = w.child_pid() or root
                    say(f"vllmwatch {fault} run {i + 1}: inject into {root}")
                    t0 = time.monotonic()
                    inject(fault, root, trigger)
                    # the host rule needs sustain x pss_interval (3 x 60 s) before it fires
                    limit = timeout + 240 if fault == "leak" else timeout
                    det = w.wait_event("restart.begin", t0, limit)
                    rec = wait_new_server(w, root, t0, limit)
                    time.sleep(1)
                    left = group_pids(root)
                    rdy = w.wait_event("child.ready", t0, 5)
                    row = {"detect_s": round(det[0] - t0, 2) if det else None,
                           "reason": det[1].get("reason") if det else None,
                           "recovered_s": round(rec - t0, 2) if rec else None,
                           "startup_s": rdy[1].get("startup_s") if rdy else None,
                           "old_group_left": left}
                    say("  ", row)
                    rows.append(row)
                    save_partial("vllmwatch", fault, rows)
                res[fault] = summarize(rows)
        finally:
            w.stop()
    if "crash_start" in faults:
        rows = []
        for i in range(runs):
            port, sport = free_port(), free_port()
            counter = tmp / f"counter-vw-{i}"
            cfg = write_config(tmp / f"vw-fake-{i}.toml", port, sport, tmp / "cache",
                               command=[PY, str(REPO / "bench" / "_flaky_start.py"),
                                        str(counter), "1"], model="tiny-fake",
                               sections={"prewarm": {"enabled": False}})
            w = Watch(cfg, RESULTS / "logs" / f"recovery-vllmwatch-crash-{i}.jsonl")
            w.port = port
            try:
                t_start = time.monotonic()
                ex = w.wait_event("child.exited", t_start, 60)
                t0 = ex[0] if ex else t_start
                det = w.wait_event("restart.begin", t_start, 60)
                rec = wait_completion(port, 60, every=0.2)
                row = {"detect_s": round(det[0] - t0, 2) if det else None,
                       "reason": det[1].get("reason") if det else None,
                       "recovered_s": round(rec - t0, 2) if rec else None}
                say(f"vllmwatch crash_start run {i + 1}:", row)
                rows.append(row)
            finally:
                w.stop()
        res["crash_start"] = summarize(rows)
    return res


# ---------------------------------------------------------------- alternatives


def run_alt(who: str, fault: str, tmp: Path, timeout: float, cron_period: float,
            kill_mode: str = "control-group") -> dict[str, Any]:
    port = free_port()
    trigger = tmp / f"leak-trigger-{who}"
    if fault == "crash_start":
        counter = tmp / f"counter-{who}-{time.monotonic_ns()}"
        serve = [PY, str(REPO / "bench" / "_flaky_start.py"), str(counter), "1",
                 "serve", "--model", "tiny", "--served-model-name", "tiny",
                 "--host", "127.0.0.1", "--port", str(port)]
    else:
        serve = vllm_argv(port)
    if who == "systemd":
        argv = [PY, str(REPO / "bench" / "restart_on_failure.py"), "--kill-mode", kill_mode,
                "--max-seconds", str(timeout + 400), "--", *serve]
    else:
        argv = [PY, str(REPO / "bench" / "cron_check.py"), "--period", str(cron_period),
                "--threshold-mib", str(HOST_LIMIT_MIB),
                "--match", rf"vllm serve .*--port {port}\b|_flaky_start.*--port {port}\b",
                "--max-seconds", str(timeout + 400), "--", *serve]
    os.environ.update({"PYTHONPATH": str(REPO / "bench" / "leakhook"),
                       "VLLMWATCH_BENCH_LEAK_TRIGGER": str(trigger),
                       "VLLMWATCH_BENCH_LEAK_MIB": str(LEAK_MIB),
                       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                       "VLLM_CPU_KVCACHE_SPACE": "1"})
    w = Watch(None, RESULTS / "logs" / f"recovery-{who}-{fault}-{kill_mode}.jsonl", argv=argv)
    w.port = port
    for k in ("PYTHONPATH", "VLLMWATCH_BENCH_LEAK_TRIGGER", "VLLMWATCH_BENCH_LEAK_MIB"):
        os.environ.pop(k, None)
    row: dict[str, Any] = {"kill_mode": kill_mode} if who == "systemd" else {
        "period_s": cron_period}
    try:
        if fault == "crash_start":
            t_start = time.monotonic()
            ex = w.wait_event("exited", t_start, 60) if who == "systemd" else None
            t0 = ex[0] if ex else t_start + 1.0  # crash 1 s into the start
            det = (w.wait_event("restart_scheduled", t_start, 60) if who == "systemd"
                   else w.wait_event("started", t_start, timeout,
                                     lambda e: e.get("why") != "initial"))
            rec = wait_completion(port, timeout, every=0.2)
        else:
            root = wait_serving(w, 400)
            if root is None:
                return {**row, "error": "never served"}
            time.sleep(5 + random.uniform(0, cron_period if who == "cron" else 3))
            say(f"{who} {fault}: inject into {root}")
            t0 = time.monotonic()
            inject(fault, root, trigger)
            if fault == "api_kill":
                time.sleep(2)
                row["listeners_2s_after"] = listeners(port)
                row["orphans_2s_after"] = cmdlines(group_pids(root))
            names = ("exited",) if who == "systemd" else ("kill", "started")
            det = None
            for name in names:
                det = w.wait_event(name, t0, timeout) or det
                if det:
                    break
            rec = wait_new_server(w, root, t0, timeout)
            row["unit_dead"] = bool(w.since(t0, "unit_dead"))
            row["start_failures"] = len([e for _, e in w.since(t0, "exited")
                                         if e.get("code") not in (None, 0)]) - (
                1 if fault == "api_kill" else 0)
            if fault == "api_kill":
                row["listeners_at_end"] = listeners(port)
                row["orphans_at_end_mib"] = group_rss_mib(root)
        row.update({"detect_s": round(det[0] - t0, 2) if det else None,
                    "detect_event": det[1] if det else None,
                    "recovered_s": round(rec - t0, 2) if rec else None})
        say(f"{who} {fault}:", row)
        return row
    finally:
        w.stop()
        for p in psutil.process_iter(["cmdline"]):  # our own leftovers on this port only
            with contextlib.suppress(psutil.Error):
                if re.search(rf"--port {port}\b", " ".join(p.info["cmdline"] or [])):
                    os.killpg(os.getpgid(p.pid), signal.SIGKILL)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    det = [r["detect_s"] for r in rows if r.get("detect_s") is not None]
    rec = [r["recovered_s"] for r in rows if r.get("recovered_s") is not None]
    return {"runs": rows, "detect_s": stats(det), "recovered_s": stats(rec),
            "never_recovered": sum(1 for r in rows if r.get("recovered_s") is None)}


def _load() -> dict[str, Any]:
    path = RESULTS / "recovery.json"
    with contextlib.suppress(OSError, ValueError):
        return dict(json.loads(path.read_text()))
    return {}


def save_partial(who: str, key: str, value: Any) -> None:
    data = _load()
    data.setdefault(who, {})[key] = value if not isinstance(value, list) else {
        "runs": value, "partial": True}
    save("recovery", data)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--who", default="vllmwatch,systemd,cron")
    ap.add_argument("--faults", default="engine_kill,hang,api_kill,leak,crash_start")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--alt-runs", type=int, default=1)
    ap.add_argument("--cron-period", type=float, default=30.0)
    ap.add_argument("--timeout", type=float, default=200.0, help="per fault, seconds")
    args = ap.parse_args()
    faults = args.faults.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="vw-recovery-"))
    (RESULTS / "logs").mkdir(parents=True, exist_ok=True)
    data = _load()
    data["machine"] = machine()
    for who in args.who.split(","):
        if who == "vllmwatch":
            for k, v in run_vllmwatch(faults, args.runs, tmp, args.timeout).items():
                data = _load() | {"machine": data["machine"]}
                data.setdefault("vllmwatch", {})[k] = v
                save("recovery", data)
            continue
        for fault in faults:
            n = args.runs if fault == "crash_start" else args.alt_runs
            modes = ["control-group", "process"] if who == "systemd" and \
                fault == "api_kill" else ["control-group"]
            for mode in modes:
                rows = [run_alt(who, fault, tmp, args.timeout if fault != "hang" else 60,
                                args.cron_period, mode) for _ in range(n)]
                key = fault if mode == "control-group" else f"{fault}_killmode_process"
                data = _load() | {"machine": data["machine"]}
                data.setdefault(who, {})[key] = summarize(rows)
                save("recovery", data)
    return 0


if __name__ == "__main__":
    cleanup_at_exit()
    sys.exit(main())
