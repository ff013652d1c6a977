"""The models the phases serve, written on the machine (no download): the project's tiny
model and a Qwen3-8B-shaped random one (model.py). A dry run writes only their stamps: the
fake vLLM serves any path."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.gpu.run import HERE, Run

TINY_STAMP = ".vllmwatch-tiny-model"
BIG_STAMP = ".complete"


def ensure_tiny(run: Run) -> None:
    if (run.tiny / TINY_STAMP).is_file():
        return
    if run.dry:
        run.tiny.mkdir(parents=True, exist_ok=True)
        (run.tiny / TINY_STAMP).write_text("dry run\n")
        return
    t = time.monotonic()
    out = run.sh(f"{sys.executable} {run.vw_src}/scripts/make_tiny_model.py {run.tiny}", 120)
    run.emit("model", "tiny", seconds=round(time.monotonic() - t, 1), out=out.splitlines()[-1:])


def biggen(run: Run) -> None:
    """Write the Qwen3-8B-shaped model (model.py) and report how long it took."""
    ensure_tiny(run)
    t = time.monotonic()
    argv = [sys.executable, str(HERE / "model.py"), str(run.big), "--tokenizer-from",
            str(run.tiny)]
    if run.dry:  # no torch here: model.py only parses its command line
        argv += ["--help"]
    r = subprocess.run(argv, capture_output=True, text=True,
                       timeout=max(60, min(400, run.left() - 20)))
    (run.logs / "biggen.log").write_text(r.stdout + r.stderr)
    run.emit("biggen", "model", rc=r.returncode, seconds=round(time.monotonic() - t, 1),
             out=r.stdout.splitlines()[-2:], err=r.stderr[-500:] if r.returncode else "",
             disk=run.sh(f"du -sh {run.big}; df -h {run.work} | tail -1"))
    if run.dry:
        run.big.mkdir(parents=True, exist_ok=True)
        (run.big / BIG_STAMP).write_text("dry run\n")


def ensure_big(run: Run) -> None:
    if not (run.big / BIG_STAMP).is_file():
        biggen(run)
