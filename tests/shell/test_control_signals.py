"""The daemon's control signals (SIGHUP: reload, SIGUSR1: graceful restart) never kill the vLLM
tree it starts: `systemctl kill -s SIGUSR1 vllmwatch` sends to every process of the unit."""

from __future__ import annotations

import os
import signal
import sys

import psutil

from tests.support import TIMEOUT_SCALE, wait_for
from vllmwatch.config.command import ChildCommand
from vllmwatch.shell import child

# The child starts a grandchild the way vLLM starts EngineCore (multiprocessing, spawn), says
# "ready" once it runs, and then lives until the test kills its group (a lifetime, not pacing).
_TREE = """
import multiprocessing as mp, time
if __name__ == "__main__":
    engine = mp.get_context("spawn").Process(target=time.sleep, args=(120,))
    engine.start()
    print("ready", engine.pid, flush=True)
    time.sleep(120)
"""


def _pending(pid: int) -> int:
    """The signals pending for the process as a whole (ShdPnd), as a bit mask."""
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        return int(next(line for line in fh if line.startswith("ShdPnd:")).split()[1], 16)


def test_sighup_and_sigusr1_to_the_whole_unit_leave_the_vllm_tree_running() -> None:
    """Before, both killed vLLM outright (Python's default action): the API server and its
    engine died with their requests, and the restart the operator asked for was not drained."""
    c = child.spawn(ChildCommand((sys.executable, "-c", _TREE), dict(os.environ)), "t" * 16)
    try:
        words = c.stdout.readline().split()
        assert words[:1] == [b"ready"], words
        tree = [c.pid, int(words[1])]
        for sig in (signal.SIGUSR1, signal.SIGHUP):
            os.killpg(c.pid, sig)
        want = (1 << (signal.SIGUSR1 - 1)) | (1 << (signal.SIGHUP - 1))
        # Held back, not delivered: pending in every process of the tree, which still runs.
        wait_for(lambda: all(_pending(p) & want == want for p in tree), 10,
                 "SIGUSR1 and SIGHUP held pending in the child and its engine")
        assert all(psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in tree)
        assert c.proc.poll() is None
    finally:
        os.killpg(c.pid, signal.SIGKILL)
        c.proc.wait(10 * TIMEOUT_SCALE)
        c.close()
