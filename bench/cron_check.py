"""Emulate the cron job people use instead of a supervisor, for bench/recovery.py.

    python bench/cron_check.py --period 300 --threshold-mib 75000 --match "vllm serve.*--port 8000"
        [--max-seconds 600] -- vllm serve ...

Every --period seconds (cron: `*/5 * * * *` -> 300) it does what the usual script does:
    if ! pgrep -f "$MATCH"; then nohup vllm serve ... &            # keep-alive branch
    elif [ "$(memory of the vLLM processes)" -gt $THRESHOLD ]; then
        pkill -f "$MATCH"; sleep up to 30 s; nohup vllm serve ... &  # memory branch
    fi
Memory is the RSS of the matched processes and their descendants (on a GPU box the script
reads nvidia-smi instead; the logic is the same). pkill sends SIGTERM to the processes whose
command line matches: the API server only, as EngineCore/Worker are renamed `VLLM::...`.
The pattern must name the port, so that this never touches anyone else's vLLM. It launches
the first instance itself at start. Events: JSON lines on stderr. Bounded by --max-seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"ts": time.time(), "event": event, **fields}), file=sys.stderr,
          flush=True)


def matching(rx: re.Pattern[str]) -> list[psutil.Process]:
    me = os.getuid()
    out = []
    for p in psutil.process_iter(["pid", "uids", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if p.info["uids"] and p.info["uids"].real == me and p.pid != os.getpid() and \
                    rx.search(" ".join(p.info["cmdline"] or [])):
                out.append(p)
    return out


def tree_rss_mib(procs: list[psutil.Process]) -> float:
    seen: set[int] = set()
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            for q in [p, *p.children(recursive=True)]:
                if q.pid not in seen:
                    seen.add(q.pid)
                    with contextlib.suppress(psutil.Error):
                        total += q.memory_info().rss
    return total / 2**20


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--period", type=float, default=300.0)
    ap.add_argument("--threshold-mib", type=float, required=True)
    ap.add_argument("--match", required=True, help="regex on the command line; name the port")
    ap.add_argument("--max-seconds", type=float, default=600.0)
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if "port" not in a.match:
        ap.error("--match must name the port (never pkill other people's vLLM)")
    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    rx = re.compile(a.match)
    pgids: list[int] = []

    def launch(why: str) -> None:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
        pgids.append(p.pid)
        emit("started", pid=p.pid, why=why)

    def on_term(*_: object) -> None:
        for g in pgids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(g, signal.SIGKILL)
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    launch("initial")
    end = time.monotonic() + a.max_seconds
    next_tick = time.monotonic() + a.period
    while time.monotonic() < end:
        time.sleep(max(0.0, min(next_tick, end) - time.monotonic()))
        if time.monotonic() >= end:
            break
        next_tick += a.period
        procs = matching(rx)
        if not procs:
            emit("tick", found=0)
            launch("not running")
            continue
        mib = tree_rss_mib(procs)
        emit("tick", found=len(procs), rss_mib=round(mib))
        if mib <= a.threshold_mib:
            continue
        emit("kill", pids=[p.pid for p in procs], rss_mib=round(mib))
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and matching(rx):
            time.sleep(0.2)
        launch("memory")
    emit("max_seconds")
    on_term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
