#!/usr/bin/env python3
"""Device side of vllm_h200.sh: a real vLLM on the H200 machine(s), plain and under
vllmwatch, measured.

    python3 bench/gpu/drive.py PHASE [PHASE ...] [--budget SECONDS]
    python3 bench/gpu/drive.py auto --budget 540   # the phases not yet done, in order, while
                                                   # each one's time estimate still fits

The phases and their estimates: bench/gpu/phases/__init__.py; the command line and the
state file: bench/gpu/cli.py. This file only makes `bench.gpu` importable from the export it
runs in (the folder above bench/, which vllm_h200.sh copies there) and calls the driver.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.gpu.cli import main

    sys.exit(main())
