"""shell/engines.py: which processes of vLLM's tree are remembered, and noticed when gone."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from tests.support import owned, wait_until
from vllmwatch.shell.engines import EngineWatch

# A parent that starts children whose command lines carry vLLM's process titles (what
# setproctitle leaves in /proc/PID/cmdline), and one that carries none.
PARENT = """
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", title])
        for title in sys.argv[1:]]
print(" ".join(str(k.pid) for k in kids), flush=True)
time.sleep(120)
"""
TITLES = ["VLLM::EngineCore", "VLLM::Worker_TP1", "VLLM::APIServer_1", "tokenizer-helper"]


@pytest.fixture
def tree() -> Iterator[tuple[int, dict[str, int]]]:
    with owned([sys.executable, "-c", PARENT, *TITLES], stdout=subprocess.PIPE,
               text=True) as root:
        assert root.stdout is not None
        pids = [int(x) for x in root.stdout.readline().split()]
        yield root.pid, dict(zip(TITLES, pids, strict=True))


def test_engine_worker_and_api_server_processes_are_watched(
        tree: tuple[int, dict[str, int]]) -> None:
    root, pids = tree
    watch = EngineWatch()
    wait_until(lambda: len(watch.look(root) or watch.seen) == 3, 10, "three titled processes")
    assert sorted(t for _, t in watch.seen.values()) == [
        "VLLM::APIServer", "VLLM::EngineCore", "VLLM::Worker"]
    assert watch.look(root) == []

    helper = psutil.Process(pids["tokenizer-helper"])
    helper.kill()  # not one of vLLM's serving processes (left a zombie: the parent sleeps)
    wait_until(lambda: helper.status() == psutil.STATUS_ZOMBIE, 10, "the helper dead")
    assert watch.look(root) == []

    psutil.Process(pids["VLLM::APIServer_1"]).kill()
    gone = wait_until(lambda: watch.look(root), 10, "the API server noticed gone")
    assert gone == [f"pid {pids['VLLM::APIServer_1']} (VLLM::APIServer)"]

    watch.reset()  # a new child: the old tree's processes are forgotten
    assert watch.look(root) == []
