"""Dry run of phases_hang here (no GPU): the phases register, and the config they write is
vllmwatch's shipped [probe] defaults around drive.py's H200 settings.

    VLLM_H200_WORK=/tmp/hangdry OUT=/tmp/hangdry/out python bench/gpu/dryrun_hang.py
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))

import drive  # noqa: E402

sys.modules["drive"] = drive
import phases_hang  # noqa: E402

from vllmwatch.config.schema import ProbeConfig, load  # noqa: E402


def main() -> int:
    """Check registration and the written config; print what the phases would run."""
    assert {"hangstop", "hangload"} <= set(drive.PHASES), drive.PHASES.keys()
    drive.WORK.mkdir(parents=True, exist_ok=True)
    cfg = load(str(phases_hang.config("dry", 8114, 9124)))
    assert dataclasses.replace(cfg.probe, canary="auto") == ProbeConfig(), cfg.probe
    print("ok: phases", [p for p in drive.ORDER if p.startswith("hang")], "probe", cfg.probe)
    print("long prompt chars", len(phases_hang.LONG_PROMPT), "runs", phases_hang.RUNS,
          "load_s", phases_hang.LOAD_S, "clients", phases_hang.CLIENTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
