"""A reload the launch would refuse is refused itself (a hostile review, 2026-12-05).

Taken, it drained the healthy vLLM (or waited for the next restart), then the launch refused
it as fatal: exit 78, "restarting will not help", the service down until someone edited the
file. Each: `config.reload_failed` naming the key, the running config kept, and the next
restart comes back with it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.support import Daemon, base_config, free_port, merge


def test_reloads_the_launch_would_refuse_keep_the_running_config(tmp_path: Path) -> None:
    cfg = base_config(free_port(), free_port())
    env = {**os.environ, "VLLM_USE_STANDALONE_COMPILE": "0"}  # the unit's Environment=
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", cfg, env=env)
    try:
        d.start()
        d.wait_ready(30)
        bad = [  # (the edit, the key its refusal names)
            (merge(cfg, {"prewarm": {"enabled": True, "mega_aot_artifact": "true"}}),
             "prewarm.mega_aot_artifact"),
            (merge(cfg, {"vllm": {"command": [str(tmp_path / "venv-typo" / "bin" / "vllm"),
                                              "serve"]}}), "vllm.command"),
        ]
        for edit, key in bad:
            d.write_config(edit)
            mark = d.mark()
            d.signal(signal.SIGHUP)
            failed = d.wait_event("config.reload_failed", 30, mark)
            assert key in str(failed.get("error")), failed
            assert not d.named("config.reloaded", mark) and not d.named("restart.begin", mark)
        mark = d.mark()
        d.signal(signal.SIGUSR1)  # any later restart: it launches the running config
        d.wait_event("restart.begin", 10, mark, reason="manual")
        d.wait_ready(60, since=mark)
        assert d.running() and not d.named("daemon.exiting", mark), d.dump()
    finally:
        d.close()
