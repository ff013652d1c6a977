#!/usr/bin/env python3
"""On a discrete NVIDIA GPU (the H200): detection says "discrete" and the start guard stays off.

    PYTHONPATH=<deps>:<checkout> python3 bench/gpu/platform_discrete.py [--gpus 0]

Three looks, each printed as a JSON line: (1) shell.platform.detect with the real pynvml;
(2) the `platform` line of `vllmwatch check --fast` for a config on that GPU; (3) the real
daemon supervising the fake vLLM with vllm.gpus set: `platform.detected unified=false`, no
`guard.*` event from launch to READY, memory source not "unified". Exit 0 when all hold.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from vllmwatch.config.schema import from_dict
from vllmwatch.shell import platform
from vllmwatch.testing.daemon import Daemon
from vllmwatch.testing.waiting import holds_within

REPO = Path(__file__).resolve().parents[2]


def _pythonpath() -> str:
    """This checkout first, then whatever the caller put on the path (the deps there)."""
    return os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))


def emit(kind: str, **fields: Any) -> None:
    print(json.dumps({"kind": kind, **fields}, default=str), flush=True)


def toml(gpus: list[int], port: int, model: Path) -> str:
    fake = [sys.executable, "-m", "vllmwatch.testing.fake_vllm", "--startup-seconds", "0.5"]
    return (f'[vllm]\nmodel = "{model}"\ncommand = {json.dumps(fake)}\nport = {port}\n'
            f"gpus = {gpus}\n[prewarm]\nenabled = false\n[status]\nlisten = \"\"\n"
            '[probe]\ninterval = "0.5s"\ncanary_interval = "1s"\n')


def run_daemon(cfg: Path, timeout: float = 60.0) -> list[dict[str, Any]]:
    """The daemon (the shared harness) until READY or timeout: every event it logged."""
    d = Daemon(cfg.parent, cfg, notify=False,
               env={**os.environ, "PYTHONPATH": _pythonpath()}).start()
    try:
        holds_within(lambda: d.named("child.ready") or d.exited(), timeout)
    finally:
        d.stop(30)
    return d.events


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, nargs="+", default=[0])
    args = ap.parse_args()
    ok = True
    config = from_dict({"vllm": {"model": "/m", "gpus": args.gpus}})
    got = platform.detect(config, lambda level, event, **f: emit("log", event=event, **f))
    emit("detect", unified=got.unified, reason=got.reason, device=got.device)
    ok &= not got.unified and got.reason == "nvml-memory-info"  # a real NVML answered
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        model.mkdir()
        (model / "model.safetensors").write_bytes(b"\0" * 4096)
        cfg = Path(tmp) / "vllmwatch.toml"
        cfg.write_text(toml(args.gpus, 18123, model))
        check = subprocess.run([sys.executable, "-m", "vllmwatch", "check", "--fast",
                                "--config", str(cfg)], capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": _pythonpath()})
        line = next((ln for ln in check.stdout.splitlines() if " platform " in ln), "")
        emit("check", line=line)
        ok &= "discrete GPU memory" in line and "start guard off" in line
        events = run_daemon(cfg)
    names = [e.get("event") for e in events]
    detected = [e for e in events if e.get("event") == "platform.detected"]
    guard = [n for n in names if str(n).startswith("guard.")]
    sources = sorted({str(e.get("source")) for e in events if e.get("event") == "memory.source"})
    emit("daemon", ready="child.ready" in names, platform=detected, guard_events=guard,
         memory_sources=sources)
    ok &= "child.ready" in names and not guard and "unified" not in sources
    ok &= bool(detected) and detected[0].get("unified") is False
    emit("summary", ok=ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
