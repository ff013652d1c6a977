"""A reload onto a vLLM command whose interpreter is slow to start (a new venv on a cold page
cache) is applied: its version probe has the probe's own deadline, not the file read's 5 s
(revB, 2026-12-05: refused after 5 s, blamed on "a hung network mount", while
`check --config-only`, the unit's first ExecReload=, had passed it)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from tests.support import Daemon, base_config, free_port, merge
from tests.support.daemon import FAKE


def test_a_reload_onto_a_slow_interpreter_is_applied(tmp_path: Path) -> None:
    slow = tmp_path / "venv2" / "bin" / "python3"
    slow.parent.mkdir(parents=True)
    slow.write_text(f"#!/bin/sh\nsleep 7\nexec {sys.executable} \"$@\"\n")  # 7 s to answer
    slow.chmod(0o755)
    cfg = base_config(free_port(), free_port())
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", cfg, env=dict(os.environ))
    try:
        d.start()
        d.wait_ready(30)
        d.write_config(merge(cfg, {"vllm": {"command": [str(slow), *FAKE[1:]]}}))
        mark = d.mark()
        d.signal(signal.SIGHUP)
        d.wait_event("config.reloaded", 40, mark)
        assert not d.named("config.reload_failed", mark), d.dump()
    finally:
        d.close(check=False)
