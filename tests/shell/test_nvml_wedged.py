"""A wedged NVIDIA driver (an NVML call that never returns) cannot hold the loop's thread: the
NVML reads the loop makes itself (the device's use before a launch, the standby's GPU check)
wait LOOP_READ_S at most, then count as unknown, and a stop is honoured (shell/memory.py
LoopReads). Before it, one stuck read on the loop's thread held SIGTERM for as long as the
driver did.

Unit tier: LoopReads alone. Loop tier: the real Loop and RealEffects over the fake vLLM, with
a fake NVML whose every call blocks once wedged.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import PYTHON, REPO, TIMEOUT_SCALE, free_port, wait_for
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.core.events import StopRequested
from vllmwatch.core.unified import Platform
from vllmwatch.shell.clock import SystemClock
from vllmwatch.shell.effects import RealEffects
from vllmwatch.shell.loop import Loop
from vllmwatch.shell.memory import LoopReads, make_sampler
from vllmwatch.testing.driver import FakeNotifier
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml
from vllmwatch.testing.world import LogCapture

SCRIPT = "#!{python}\nimport sys\nfrom vllmwatch.testing.fake_vllm import main\n" \
         "if __name__ == '__main__':\n    sys.exit(main())\n"
# The waits on expected events scale it (wait_for, TIMEOUT_SCALE); the stuck read's `< WAIT`
# (ended by its deadline, never by the wedged driver) does not.
WAIT = 60.0


class WedgedNvml(FakeNvml):
    """FakeNvml whose every call blocks while `wedged` is set, until `unwedged` is."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__(gpus)
        self.wedged, self.unwedged = threading.Event(), threading.Event()
        self.stuck: list[str] = []

    def _enter(self, name: str, handle: int | None = None) -> None:
        if self.wedged.is_set() and not self.unwedged.is_set():
            self.stuck.append(name)
            self.unwedged.wait()
        super()._enter(name, handle)


# ---- unit tier ----

def test_a_read_that_answers_is_passed_through_and_what_it_raises_is_raised() -> None:
    log = LogCapture()
    nvml = FakeNvml([FakeGpu(used_mib=1234.0, procs={42: 1000.0})])
    reads = LoopReads(lambda: make_sampler([0], log, nvml=nvml), log, wait=5.0)
    assert reads.device_used_mib() == {0: 1234.0}
    procs = reads.gpu_processes()
    assert procs is not None and [p.pid for p in procs] == [42]
    assert reads.sample(None, False, faults=False).device_used_mib == {0: 1234.0}
    with pytest.raises(ValueError, match="boom"):
        reads.within("x", lambda: (_ for _ in ()).throw(ValueError("boom")), lambda: 0)
    assert not log.named("nvml.stuck")


def test_a_stuck_read_answers_unknown_by_its_deadline_and_only_one_thread_sticks() -> None:
    log = LogCapture()
    nvml = WedgedNvml([FakeGpu(used_mib=1234.0, procs={42: 1000.0})])
    sampler = make_sampler([0], log, nvml=nvml)  # NVML open before the driver wedges
    reads = LoopReads(lambda: sampler, log, wait=2.0)  # (a loaded box answers well within)
    nvml.wedged.set()
    try:
        before = time.monotonic()
        assert reads.device_used_mib() == {}
        assert time.monotonic() - before < WAIT  # ended by the deadline, not by the driver
        assert reads.gpu_processes() is None  # the first is still stuck: unknown at once,
        assert reads.sample(None, False).device_total_mib == {}
        assert len(nvml.stuck) == 1, nvml.stuck  # and no second thread went in
        (stuck,) = log.named("nvml.stuck")
        assert stuck["read"] == "device_used_mib" and stuck["waited_s"] == 2.0
        assert "hint" in stuck and "stops are still honoured" in stuck["effect"]
    finally:
        nvml.unwedged.set()
    wait_for(lambda: reads.device_used_mib() == {0: 1234.0}, WAIT, "NVML answering again")
    assert [f["read"] for f in log.named("nvml.answering")] == ["device_used_mib"]
    assert len(log.named("nvml.stuck")) == 1


# ---- loop tier ----

def _config(tmp: Path, standby: str) -> Config:
    script = tmp / "vllm"
    script.write_text(SCRIPT.format(python=PYTHON))
    script.chmod(0o755)
    return from_dict({
        "vllm": {"command": [str(script), "--startup-seconds", "0.3"], "model": "tiny",
                 "port": free_port(), "gpus": [0]},
        "restart": {"standby": standby},
        "prewarm": {"enabled": False, "cache_dir": str(tmp / "cache")},
    }, path=str(tmp / "vllmwatch.toml"))


@pytest.fixture
def wedge(tmp_path: Path) -> Iterator[dict[str, Any]]:
    nvml = WedgedNvml([FakeGpu(used_mib=0.0)])
    made: list[tuple[Loop, threading.Thread]] = []
    log = LogCapture()
    sampler = make_sampler([0], log, nvml=nvml)  # opened before any test wedges it

    def start(standby: str) -> tuple[Loop, RealEffects, list[int]]:
        config = _config(tmp_path, standby)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        fx = RealEffects(config, log, FakeNotifier(), env,
                         sampler=sampler, platform=Platform(unified=False, reason="test"))
        fx.reads = LoopReads(lambda: fx.sampler, log, wait=1.0)
        loop = Loop(config, fx, SystemClock(), environ=env, install_signals=False)
        codes: list[int] = []
        runner = threading.Thread(target=lambda: codes.append(loop.run()), daemon=True)
        made.append((loop, runner))
        runner.start()
        return loop, fx, codes

    try:
        yield {"nvml": nvml, "log": log, "start": start}
    finally:
        nvml.unwedged.set()  # the stuck workers and reads return; a loop still held ends
        for loop, runner in made:
            if runner.is_alive():
                loop.post(StopRequested("SIGTERM"))
                runner.join(WAIT * TIMEOUT_SCALE)


def _stopped(loop: Loop, codes: list[int], child: int | None) -> None:
    loop.post(StopRequested("SIGTERM"))
    wait_for(lambda: codes, WAIT, "the loop to honour the stop with NVML wedged")
    assert codes == [0]
    if child is not None:
        wait_for(lambda: not psutil.pid_exists(child), WAIT, "the child to be gone")


def test_a_launch_with_nvml_wedged_goes_on_and_a_stop_is_honoured(
        wedge: dict[str, Any]) -> None:
    nvml: WedgedNvml = wedge["nvml"]
    log: LogCapture = wedge["log"]
    nvml.wedged.set()  # from the start: the launch reads the device's use first
    loop, _fx, codes = wedge["start"]("false")
    wait_for(lambda: log.named("child.started"), WAIT, "the launch past the stuck read")
    assert [f["read"] for f in log.named("nvml.stuck")] == ["device_used_mib"]
    child = log.named("child.started")[0]["pid"]
    _stopped(loop, codes, child)


def test_the_standbys_gpu_check_with_nvml_wedged_lets_a_stop_through(
        wedge: dict[str, Any]) -> None:
    nvml: WedgedNvml = wedge["nvml"]
    log: LogCapture = wedge["log"]
    loop, fx, codes = wedge["start"]("true")
    wait_for(lambda: fx.launcher.info().get("standby_state") == "waiting", WAIT,
               "READY and the standby built")
    child = loop.state.pid
    nvml.wedged.set()
    fx.launcher._next_watch = 0.0  # its next look is due now (it looks every few seconds)
    wait_for(lambda: nvml.stuck, WAIT, "the standby's look at NVML to stick")
    _stopped(loop, codes, child)
    assert log.named("nvml.stuck")[0]["read"] == "gpu_processes"
    assert not log.named("standby.discarded")  # unknown is not "on a GPU"
