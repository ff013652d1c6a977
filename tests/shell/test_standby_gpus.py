"""The standby and EngineCore-by-fork with tensor parallelism on two (fake) GPUs (issue 27's
fast part): RealEffects with a fake NVML of two H200s and the fake vLLM behind a console
script, driven by hand as the loop would drive it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import PYTHON, REPO, dead, free_port, launching, wait_for
from tests.support.procs import environ
from vllmwatch.config.launch import FORK_VARIABLE
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.core.actions import CheckRelease, Sweep
from vllmwatch.core.events import Event, Spawned
from vllmwatch.core.state import S
from vllmwatch.core.unified import Platform
from vllmwatch.shell.effects import RealEffects
from vllmwatch.shell.memory import make_sampler
from vllmwatch.testing.driver import FakeNotifier
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml
from vllmwatch.testing.world import LogCapture

SCRIPT = "#!{python}\nimport sys\nfrom vllmwatch.testing.fake_vllm import main\n" \
         "if __name__ == '__main__':\n    sys.exit(main())\n"


def _config(tmp: Path, tp: int, standby: str = "true") -> Config:
    script = tmp / "vllm"
    script.write_text(SCRIPT.format(python=PYTHON))
    script.chmod(0o755)
    return from_dict({
        "vllm": {"command": [str(script), "--startup-seconds", "0.3"], "model": "tiny",
                 "port": free_port(), "gpus": [0, 1],
                 "args": {"tensor-parallel-size": tp}},
        "restart": {"standby": standby},
        "prewarm": {"enabled": False, "cache_dir": str(tmp / "cache")},
    })


@pytest.fixture
def two_gpus(tmp_path: Path) -> Iterator[dict[str, Any]]:
    nvml = FakeNvml([FakeGpu(used_mib=0.0), FakeGpu(used_mib=0.0)])
    log = LogCapture()
    made: list[RealEffects] = []

    def make(config: Config) -> RealEffects:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        fx = RealEffects(config, log, FakeNotifier(), env,
                         sampler=make_sampler([0, 1], log, nvml=nvml),
                         platform=Platform(unified=False, reason="test"))
        made.append(fx)
        return fx

    yield {"nvml": nvml, "log": log, "make": make}
    for fx in made:
        fx.close()


def _spawn(fx: RealEffects, config: Config) -> Spawned:
    events: list[Event] = []
    got = launching.spawn(fx, config, events.append)
    assert isinstance(got, Spawned), got
    return got


def _standby_waiting(fx: RealEffects, child_pid: int, config: Config) -> int:
    def waiting() -> bool:
        fx.tend_standby(S.READY, child_pid, config)  # the loop's standby step, as on READY
        return fx.launcher.info()["standby_state"] == "waiting"
    wait_for(waiting, 30, "the standby's imports")
    pid = fx.launcher.info()["standby_pid"]
    assert isinstance(pid, int)
    return pid


def test_tp2_keeps_vllms_choice_and_the_standby_is_used(two_gpus: dict[str, Any],
                                                        tmp_path: Path) -> None:
    config = _config(tmp_path, tp=2)
    fx = two_gpus["make"](config)
    first = _spawn(fx, config)
    env = environ(first.pid)
    assert FORK_VARIABLE not in env and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    standby = _standby_waiting(fx, first.pid, config)
    nvml: FakeNvml = two_gpus["nvml"]
    # The old tree holds memory on both GPUs; the standby holds none and is never listed.
    def tree() -> list[int]:  # EngineCore and its two TP workers, once the fake made them
        kids = [p.pid for p in psutil.Process(first.pid).children(recursive=True)]
        return kids if len(kids) >= 3 else []
    workers = wait_for(tree, 30, "the fake's engine and TP workers")
    nvml.gpus[0].procs, nvml.gpus[1].procs = {first.pid: 1000.0}, {workers[-1]: 1000.0}
    nvml.gpus[0].used_mib = nvml.gpus[1].used_mib = 1000.0
    os.killpg(first.pid, signal.SIGTERM)
    wait_for(lambda: fx.poll_child() is not None, 20, "the old child to exit")
    done = fx.sweep(Sweep(first.pid, "127.0.0.1", config.vllm.port, settle=3.0))
    assert standby not in done.killed and psutil.pid_exists(standby)
    gate = CheckRelease(old_pids=(first.pid, *workers), tolerance_mib=512.0)
    assert not fx.check_release(gate).released  # still listed on both GPUs
    nvml.gpus[0].procs, nvml.gpus[1].procs = {}, {}
    nvml.gpus[0].used_mib = nvml.gpus[1].used_mib = 0.0
    assert fx.check_release(gate).released  # over both GPUs, with the standby alive
    second = _spawn(fx, config)
    assert second.launch == "standby" and second.pid == standby
    assert os.getpgid(standby) == standby


def test_tp1_gets_fork(two_gpus: dict[str, Any], tmp_path: Path) -> None:
    config = _config(tmp_path, tp=1)
    fx = two_gpus["make"](config)
    first = _spawn(fx, config)
    assert psutil.Process(first.pid).environ()[FORK_VARIABLE] == "fork"


def test_a_standby_that_nvml_lists_is_discarded(two_gpus: dict[str, Any],
                                                tmp_path: Path) -> None:
    config = _config(tmp_path, tp=2)
    fx = two_gpus["make"](config)
    first = _spawn(fx, config)
    standby = _standby_waiting(fx, first.pid, config)
    two_gpus["nvml"].gpus[1].procs = {standby: 518.0}  # a CUDA context, somehow
    fx.launcher._next_watch = 0.0  # the next look is due now (it looks every few seconds)
    fx.tend_standby(S.READY, first.pid, config)  # the loop's standby step, as on READY
    gone = two_gpus["log"].named("standby.discarded")
    assert gone and "NVML lists it" in gone[-1]["reason"]
    wait_for(lambda: dead(standby), 10, "it to go")
    assert fx.launcher.info()["standby_state"] == "off"


def test_auto_is_off_on_unified_memory(two_gpus: dict[str, Any], tmp_path: Path) -> None:
    config = _config(tmp_path, tp=1, standby="auto")
    fx = two_gpus["make"](config)
    fx.platform = Platform(unified=True, reason="test")
    first = _spawn(fx, config)
    fx.tend_standby(S.READY, first.pid, config)  # the loop's standby step, as on READY
    off = two_gpus["log"].named("standby.off")
    assert off and "unified memory" in off[-1]["reason"]
