"""A vLLM root that exited and is not reaped yet (a zombie) still owns its tree: its engine,
reparented at the root's exit, keeps the root's session and its GPU memory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil

from tests.support import TIMEOUT_SCALE, owned, wait_until
from vllmwatch.shell.memory import make_sampler, tree_pids
from vllmwatch.testing.driver import LogCapture
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml

# The root starts an "engine" that stays (as vLLM's EngineCore outlives a crashed API server
# for a moment) and exits at once; nobody reaps it until the test ends.
_ENGINE = ("import sys, time\n"
           "open(sys.argv[1], 'w').write('ready')\n"
           "while True:\n"
           "    time.sleep(3600)\n")  # a lifetime, not a wait: its owner kills it
_ROOT = ("import subprocess, sys\n"
         "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]])\n")


def _zombie(root: int) -> bool:
    try:
        return psutil.Process(root).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _engine_of(root: int) -> int:
    return next(p.pid for p in psutil.process_iter() if p.pid != root
                and _safe_sid(p.pid) == root)


def _safe_sid(pid: int) -> int:
    try:
        return os.getsid(pid)
    except OSError:
        return -1


def test_a_zombie_roots_engine_is_still_its_tree(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    with owned([sys.executable, "-c", _ROOT, _ENGINE, str(ready)]) as root:
        wait_until(lambda: ready.exists() and _zombie(root.pid), 30 * TIMEOUT_SCALE,
                   "the engine to start and the root to exit unreaped")
        engine = _engine_of(root.pid)
        assert psutil.Process(engine).ppid() != root.pid  # reparented: children() is blind
        # Before: (root,) alone, and the engine's 6000 MiB read as a 0 MiB tree.
        assert set(tree_pids(root.pid)) == {root.pid, engine}
        nvml = FakeNvml([FakeGpu(used_mib=6500.0, procs={engine: 6000.0})])
        sample = make_sampler(None, LogCapture(), nvml=nvml).sample(root.pid, False)
        assert (sample.source, sample.gpu_tree_mib) == ("nvml-process", 6000.0)
        root.wait(30 * TIMEOUT_SCALE)  # reaped: the tree is gone with its root, as before
        assert tree_pids(root.pid) == ()
