"""shell/passon.py: what outlived the leader of a planned stop gets the SIGTERM only after the
sweep's settle. vLLM's own engine and workers follow their API server within it; told at
once, every stop of a vLLM that is the command itself (no wrapper) said child.passed_on, "a
wrapper that did not pass the SIGTERM on? Start vLLM with exec", to a person reading the
journal, and SIGTERMed an engine that was ending by itself (merge review, 2026-12-06)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from tests.support import TIMEOUT_SCALE
from tests.support.procs import owned
from vllmwatch.shell import passon
from vllmwatch.shell.child import _alive

# Writes the file named by argv[1] when it gets SIGTERM, then exits; else ends by itself
# after argv[2] s (a lifetime: the owner kills it).
_CHILD = ("import signal, sys, time\n"
          "def term(*_):\n"
          "    open(sys.argv[1], 'w').write('term')\n"
          "    sys.exit(0)\n"
          "signal.signal(signal.SIGTERM, term)\n"
          "open(sys.argv[1] + '.up', 'w').write('up')\n"
          "time.sleep(float(sys.argv[2]))\n")


def _run(tmp_path: Path, lifetime: float, quiet: float) -> tuple[list[Any], Path, bool]:
    mark = tmp_path / "mark"
    logs: list[Any] = []
    with owned([sys.executable, "-c", _CHILD, str(mark), str(lifetime)],
               stdout=subprocess.DEVNULL) as proc:
        up = Path(f"{mark}.up")
        while not up.exists() and proc.poll() is None:
            time.sleep(0.02)  # pacing: a poll for the child's start, ended by its exit
        left = passon.wait([psutil.Process(proc.pid)], 120.0 * TIMEOUT_SCALE,
                           lambda *a, **k: logs.append((a, k)), _alive, quiet)
        return logs, mark, not left


def test_a_process_that_ends_within_the_quiet_time_is_not_told(tmp_path: Path) -> None:
    logs, mark, gone = _run(tmp_path, lifetime=0.3, quiet=60.0)
    assert gone and not mark.exists() and not logs, logs


def test_a_process_still_there_after_the_quiet_time_gets_the_sigterm(tmp_path: Path) -> None:
    logs, mark, gone = _run(tmp_path, lifetime=600.0, quiet=0.2)
    assert gone and mark.read_text() == "term"
    assert [a[1] for a, _ in logs] == ["child.passed_on"], logs
