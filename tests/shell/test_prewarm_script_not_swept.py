"""A stop during the pre-warm's kernel step: the stop's sweep (the daemon is a subreaper)
took the warm script, a child of ours in a session of its own, for an adopted orphan, killed
it and logged `leftovers.killed` ("processes of an earlier child's tree were still
running"), a false lead at 3 a.m. for our own helper. The script is its owner's: the sweep
leaves it, the cancel of the pre-warm kills its group (tests/shell/test_prewarm_cancel.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support import TIMEOUT_SCALE, dead, free_port, wait_for
from vllmwatch.config import vllminfo
from vllmwatch.config.schema import from_dict
from vllmwatch.core.actions import Sweep
from vllmwatch.prewarm import kernels
from vllmwatch.shell.effects import RealEffects
from vllmwatch.shell.reaper import Reaper
from vllmwatch.testing.driver import FakeNotifier

SLEEPER = ("import os, time\n"
           "open(os.environ['PIDFILE'], 'w').write(str(os.getpid()))\n"
           "time.sleep(600)\n")  # a lifetime, not a wait: its owner (the cancel) kills it


def test_the_stops_sweep_leaves_the_warm_script_to_the_prewarms_cancel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))  # the group file
    # ... and the incidents folder (read from the environ given: else /run/vllmwatch)
    state = {"STATE_DIRECTORY": str(tmp_path / "state")}
    monkeypatch.setattr(vllminfo, "version", lambda _command: None)
    config = from_dict({"vllm": {"command": [sys.executable], "model": "m", "gpus": []}})
    said: list[tuple[str, dict[str, Any]]] = []

    def log(_level: str, event: str, **kw: Any) -> None:
        said.append((event, kw))

    fx = RealEffects(config, log, FakeNotifier(), {"PATH": "/usr/bin:/bin", **state},
                     reaper=Reaper(log))
    pidfile = tmp_path / "script.pid"
    cancel = threading.Event()
    got: list[kernels.KernelOutcome] = []
    worker = threading.Thread(target=lambda: got.append(kernels.run_script(
        sys.executable, {}, {**os.environ, "PIDFILE": str(pidfile)}, 600, script=SLEEPER,
        cancel=cancel)), daemon=True)
    worker.start()
    script_pid = 0
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text() != "", 60, "the script")
        script_pid = int(pidfile.read_text())
        done = fx.sweep(Sweep(None, "127.0.0.1", free_port(), True))
        assert script_pid not in done.killed, done
        assert not dead(script_pid), "the sweep killed the pre-warm's own warm script"
        cancel.set()  # the loop's close(): the pre-warm's owner ends it
        worker.join(30 * TIMEOUT_SCALE)
        assert got and "asked to stop" in got[0].detail, got
        wait_for(lambda: dead(script_pid), 10, f"the warm script {script_pid} to die")
        assert script_pid not in kernels.RUNNING
    finally:
        cancel.set()
        if script_pid and not dead(script_pid):
            with contextlib.suppress(OSError):
                os.killpg(script_pid, signal.SIGKILL)
        fx.close()
