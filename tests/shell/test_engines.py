"""shell/engines.py: which processes of vLLM's tree are remembered, and noticed when gone."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support import TIMEOUT_SCALE, owned, wait_for
from vllmwatch.shell import kin
from vllmwatch.shell.engines import EngineWatch

# A lifetime, not a wait: its owner kills it. It outlives the test's scaled waits.
LIFETIME = 120 * TIMEOUT_SCALE
# A parent that starts children whose command lines carry vLLM's process titles (what
# setproctitle leaves in /proc/PID/cmdline), and one that carries none.
PARENT = f"""
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep({LIFETIME})", title])
        for title in sys.argv[1:]]
print(" ".join(str(k.pid) for k in kids), flush=True)
time.sleep({LIFETIME})
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
    wait_for(lambda: len(watch.look(root) or watch.seen) == 3, 10, "three titled processes")
    assert sorted(t for _, t in watch.seen.values()) == [
        "VLLM::APIServer", "VLLM::EngineCore", "VLLM::Worker"]
    assert watch.look(root) == []

    helper = psutil.Process(pids["tokenizer-helper"])
    helper.kill()  # not one of vLLM's serving processes (left a zombie: the parent sleeps)
    wait_for(lambda: helper.status() == psutil.STATUS_ZOMBIE, 10, "the helper dead")
    assert watch.look(root) == []

    psutil.Process(pids["VLLM::APIServer_1"]).kill()
    gone = wait_for(lambda: watch.look(root), 10, "the API server noticed gone")
    assert gone == [f"pid {pids['VLLM::APIServer_1']} (VLLM::APIServer) killed by SIGKILL "
                    "(the OOM killer? see the incident record)"]

    engine = psutil.Process(pids["VLLM::EngineCore"])
    engine.send_signal(15)  # how it died is said once, from the zombie (issue 36.15)
    gone = wait_for(lambda: len(watch.look(root)) == 2 and watch.look(root), 10, "engine")
    assert f"pid {engine.pid} (VLLM::EngineCore) killed by SIGTERM" in gone, gone

    watch.reset()  # a new child: the old tree's processes are forgotten
    assert watch.look(root) == []
    watch.close()


@pytest.mark.parametrize("step", [27.0, -27.0])
def test_a_wall_clock_step_kills_no_engine(tree: tuple[int, dict[str, int]],
                                           monkeypatch: pytest.MonkeyPatch, step: float) -> None:
    """An NTP step moves psutil's create_time of every process (boot time + ticks, the boot
    time from the wall clock). CI, 2026-12-04: after a 27 s step every engine of a live vLLM
    looked dead, and its start skipped /health until startup.stall_timeout restarted it."""
    root, pids = tree
    watch = EngineWatch()
    wait_for(lambda: len(watch.look(root) or watch.seen) == 3, 10, "three titled processes")
    real = psutil._psplatform.boot_time  # type: ignore[attr-defined]
    monkeypatch.setattr(psutil._psplatform, "boot_time", lambda: real() + step)
    assert watch.look(root) == []
    assert sorted(watch.engines()) == sorted([pids["VLLM::EngineCore"],
                                              pids["VLLM::Worker_TP1"]])
    psutil.Process(pids["VLLM::Worker_TP1"]).kill()  # a real death is still seen
    gone = wait_for(lambda: watch.look(root), 10, "the worker noticed gone")
    assert gone and gone[0].startswith(f"pid {pids['VLLM::Worker_TP1']} (VLLM::Worker)"), gone
    watch.close()


# vLLM's API server: waits on the engine's sentinel, logs, then reaps it at once.
REAPER = f"""
import multiprocessing as mp, multiprocessing.connection as mc, sys, time
def run(): time.sleep({LIFETIME})
if __name__ == "__main__":
    sys.argv[0] = "VLLM::APIServer"
    p = mp.get_context("spawn").Process(target=run, name="VLLM::EngineCore"); p.start()
    print(p.pid, flush=True)
    mc.wait([p.sentinel]); print("died unexpectedly", flush=True); p.join(); time.sleep({LIFETIME})
"""


def test_an_engine_reaped_by_its_parent_at_once_still_says_how_it_died(tmp_path: Path
                                                                       ) -> None:
    # The exit status is read through a pidfd the moment the engine dies: vLLM reaps its
    # EngineCore within milliseconds, long before the next probe. Best effort (a race):
    # the status or "not seen", never a wrong one.
    script = tmp_path / "reaper.py"
    script.write_text(REAPER)
    with owned([sys.executable, str(script)], stdout=subprocess.PIPE, text=True) as root:
        assert root.stdout is not None
        pid = int(root.stdout.readline())
        watch = EngineWatch()
        started = kin.started(pid)
        assert started is not None
        watch.seen[pid] = (started, "VLLM::EngineCore")
        watch._exits.watch(pid)
        psutil.Process(pid).kill()
        assert root.stdout.readline().strip() == "died unexpectedly"
        gone = wait_for(lambda: watch.look(root.pid), 10, "the engine noticed gone")
        assert gone[0].startswith(f"pid {pid} (VLLM::EngineCore) "), gone
        assert gone[0].endswith(("killed by SIGKILL (the OOM killer? see the incident record)",
                                 "exit status not seen (its parent reaped it first)")), gone
        watch.close()


def test_one_look_at_a_time_walks_the_table(tree: tuple[int, dict[str, int]],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A health probe's look (a worker thread) and the reap's (the loop) may meet: the second
    waits for the first, so `seen` never grows under a walk of it. The first look is held
    inside its walk until the second enters (it never should) or a bounded wait ends."""
    import threading
    import types

    from vllmwatch.shell import engines

    root, _ = tree
    watch = EngineWatch()
    order: list[str] = []
    second_in = threading.Event()
    first_inside = threading.Event()
    real_title = engines._title
    real_process = psutil.Process

    def title(proc: psutil.Process) -> str | None:
        if threading.current_thread().name == "first" and not first_inside.is_set():
            first_inside.set()
            second_in.wait(3 * TIMEOUT_SCALE)  # the second look enters here only unlocked
        return real_title(proc)

    def process(pid: int) -> psutil.Process:
        name = threading.current_thread().name
        order.append(f"{name} in")
        if name == "second":
            second_in.set()
        return real_process(pid)

    monkeypatch.setattr(engines, "_title", title)
    monkeypatch.setattr(engines, "psutil", types.SimpleNamespace(Process=process,
                                                                 Error=psutil.Error))
    first = threading.Thread(target=lambda: order.append(f"first saw {watch.look(root)}"),
                             name="first")
    second = threading.Thread(target=lambda: order.append(f"second saw {watch.look(root)}"),
                              name="second")
    first.start()
    assert first_inside.wait(10 * TIMEOUT_SCALE), "the first look never reached a title"
    second.start()
    first.join(20 * TIMEOUT_SCALE)
    second.join(20 * TIMEOUT_SCALE)
    assert order == ["first in", "first saw []", "second in", "second saw []"]
