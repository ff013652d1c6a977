"""How long an incident record delays a restart (issue 25: at most ~3 s, the dumper's deadline).

    .venv/bin/python -m bench.incidents [--vllm fake|real] [--fault hang|crash] [--runs 5]

For each restart: `restart.begin` -> the take-down starting (`child.stopping`, SIGTERM, for a
hang; the sweep's `state.changed to=cleanup` for a crash), with [incidents] enabled and then
disabled, and the record's own time (`incident.recorded seconds`). The difference of the two
medians is what a record costs a restart. Faults: hang = the fake's --deadlock-after 1 (a
real deadlock of its engine) or SIGSTOP of the real EngineCore; crash = the fake's
--exit-after 1, or SIGKILL of the real API server. Writes bench/results/incidents-<vllm>.json.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import (
    PY,
    Watch,
    find_in_tree,
    free_port,
    machine,
    save,
    say,
    write_config,
)

FAKE = [PY, "-m", "vllmwatch.testing.fake_vllm", "--startup-seconds", "0.3"]
Sections = dict[str, dict[str, Any]]
FAST: Sections = {
    "probe": {"interval": "0.5s", "timeout": "1s", "canary_interval": "1s",
              "canary_timeout": "1s", "metrics_interval": "0.5s"},
    "restart": {"backoff_initial": "0.2s", "backoff_max": "1s", "max_restarts": 1000,
                "stop_timeout": "3s"},
    "prewarm": {"enabled": False}}
REAL: Sections = {
    "probe": {"interval": "1s", "timeout": "2s", "canary_interval": "3s",
              "canary_timeout": "5s", "metrics_interval": "2s"},
    "restart": {"backoff_initial": "0.5s", "max_restarts": 1000, "stop_timeout": "10s"},
    "prewarm": {"enabled": False}, "startup": {"timeout": "5m"}}


def _config(work: Path, args: argparse.Namespace, enabled: bool) -> Path:
    sections: Sections = {**(FAST if args.vllm == "fake" else REAL)}
    sections["incidents"] = {"enabled": enabled}
    command = None
    if args.vllm == "fake":
        fault = ["--deadlock-after", "1"] if args.fault == "hang" else ["--exit-after", "1",
                                                                           "--exit-code", "1"]
        sections["vllm"] = {"extra_args": fault}
        command = FAKE
    path = work / f"vllmwatch-{enabled}.toml"
    if command is None:
        return write_config(path, free_port(), free_port(), work / "cache", sections=sections)
    return write_config(path, free_port(), free_port(), work / "cache", sections=sections,
                        command=command, model="tiny")


def _inject(w: Watch, fault: str) -> None:
    pid = w.child_pid()
    assert pid is not None
    if fault == "hang":
        for p in find_in_tree(pid, "VLLM::EngineCore"):
            p.suspend()
    else:
        os.kill(pid, signal.SIGKILL)


def _cycle(w: Watch, args: argparse.Namespace, t0: float) -> dict[str, float] | None:
    """One restart: the fault (real vLLM: injected once READY), then the figures."""
    timeout = 30.0 if args.vllm == "fake" else 300.0
    if args.vllm == "real":
        if w.wait_event("child.ready", t0, timeout) is None:
            return None
        _inject(w, args.fault)
    begin = w.wait_event("restart.begin", t0, timeout)
    if begin is None:
        return None
    tb = begin[0]
    if args.fault == "hang":
        down = w.wait_event("child.stopping", tb, 30.0)
    else:
        down = w.wait_event("state.changed", tb, 30.0, lambda e: e.get("to") == "cleanup")
    rec = w.wait_event("incident.recorded", tb, 10.0) if args.enabled else None
    if down is None:
        return None
    out = {"delay_s": down[0] - tb}
    if rec is not None:
        out["record_s"] = float(rec[1]["seconds"])
    return out


def run(args: argparse.Namespace, enabled: bool) -> list[dict[str, float]]:
    args.enabled = enabled
    work = Path(tempfile.mkdtemp(prefix="vw-bench-incidents-"))
    os.environ["STATE_DIRECTORY"] = str(work / "state")
    w = Watch(_config(work, args, enabled), work / f"log-{enabled}.jsonl")
    got: list[dict[str, float]] = []
    t0 = time.monotonic()
    try:
        for i in range(args.runs):
            one = _cycle(w, args, t0)
            if one is None:
                say(f"records {'on' if enabled else 'off'}: cycle {i + 1} timed out")
                break
            got.append(one)
            say(f"records {'on' if enabled else 'off'}: {one}")
            t0 = time.monotonic()
    finally:
        w.stop()
    return got


def _summary(rows: list[dict[str, float]], key: str) -> dict[str, float] | None:
    xs = [r[key] for r in rows if key in r]
    if not xs:
        return None
    return {"n": len(xs), "median": round(statistics.median(xs), 3),
            "max": round(max(xs), 3), "min": round(min(xs), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vllm", choices=("fake", "real"), default="fake")
    p.add_argument("--fault", choices=("hang", "crash"), default="hang")
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    on, off = run(args, True), run(args, False)
    result = {"machine": machine(), "vllm": args.vllm, "fault": args.fault,
              "on": {"delay": _summary(on, "delay_s"), "record": _summary(on, "record_s")},
              "off": {"delay": _summary(off, "delay_s")}, "runs": {"on": on, "off": off}}
    d_on, d_off = result["on"]["delay"], result["off"]["delay"]
    if d_on and d_off:
        result["added_median_s"] = round(d_on["median"] - d_off["median"], 3)
    say(result)
    save(f"incidents-{args.vllm}-{args.fault}", result)


if __name__ == "__main__":
    main()
