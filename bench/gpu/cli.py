"""The driver's command line: `drive.py PHASE [PHASE ...] [--budget SECONDS]`, or `auto`.

`auto` records each phase in WORK/state.json, failed ones too (status "error: ..."), and never
repeats one: name a phase to run it again. Every measurement is one JSON line: printed as
'## {...}' and appended to $OUT/summary.jsonl. Raw logs go to WORK/logs (vllm_h200.sh packs
them into $OUT/logs.tar.gz). Times are seconds (monotonic clock) from the event named in the
field.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from typing import Any

from bench.gpu.phases import BY_NAME, PHASES
from bench.gpu.run import Run


def load_state(run: Run) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads((run.work / "state.json").read_text())
        return state
    except (OSError, ValueError):
        return {"done": {}}


def run_phase(run: Run, name: str, state: dict[str, Any]) -> str:
    """One phase, whatever it does: its status ("ok" or "error: ...") is recorded."""
    t = time.monotonic()
    run.emit(name, "begin", left_s=round(run.left()))
    status = "ok"
    try:
        BY_NAME[name].run(run)
    except Exception as exc:
        status = f"error: {type(exc).__name__}: {exc}"
        run.emit(name, "error", error=status, tb=traceback.format_exc()[-3000:])
        run.sweep(name)
    state["done"][name] = {"status": status, "seconds": round(time.monotonic() - t, 1)}
    (run.work / "state.json").write_text(json.dumps(state, indent=1))
    run.emit(name, "end", status=status, seconds=round(time.monotonic() - t, 1))
    return status


def auto(run: Run, state: dict[str, Any]) -> None:
    """The auto phases not yet done, in order, while each one's estimate still fits."""
    for phase in PHASES:
        if not phase.auto or phase.name in state["done"]:
            continue
        if run.left() < phase.est:
            run.emit("auto", "stop", next=phase.name, left_s=round(run.left()),
                     needs_s=phase.est)
            break
        run_phase(run, phase.name, state)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="a real vLLM under vllmwatch on the GPU machine")
    ap.add_argument("phases", nargs="+", choices=["auto", *BY_NAME], metavar="PHASE",
                    help="auto, or phase names: " + ", ".join(BY_NAME))
    ap.add_argument("--budget", type=float, default=540, help="seconds this call may use")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None, run: Run | None = None) -> int:
    """Run the phases asked for; run (the dry run's) or one from vllm_h200.sh's environment."""
    a = parse(argv)
    run = run or Run.from_env(a.budget)
    run.out.mkdir(parents=True, exist_ok=True)
    run.logs.mkdir(parents=True, exist_ok=True)
    state = load_state(run)
    if a.phases == ["auto"]:
        auto(run, state)
    else:
        for name in a.phases:
            run_phase(run, name, state)
    run.emit("auto", "state", done=state["done"], left_s=round(run.left()))
    return 0
