"""Bench-only: the fake vLLM that crashes during start on its first N launches.

    python bench/_flaky_start.py COUNTER_FILE N_CRASHES [fake vLLM args...]

Each launch increments COUNTER_FILE; launches 1..N get --crash-during-start 1.0 (exit 1 one
second into a 2 s start), later ones start normally.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    counter, crashes, rest = Path(argv[0]), int(argv[1]), argv[2:]
    n = int(counter.read_text() or "0") + 1 if counter.exists() else 1
    counter.write_text(str(n))
    args = [sys.executable, "-m", "vllmwatch.testing.fake_vllm", *rest, "--startup-seconds", "2"]
    if n <= crashes:
        args += ["--crash-during-start", "1.0"]
    os.execv(sys.executable, args)


if __name__ == "__main__":
    main(sys.argv[1:])
