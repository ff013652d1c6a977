"""The standby on two (fake) GPUs beyond test_standby_gpus.py (issue 27's fast part): with
TP=2 the standby is outside the tree's memory figure on both GPUs; two daemons, one per GPU,
each with a standby: a restart of one leaves the other's standby, child and GPU alone; an
operator's VLLM_WORKER_MULTIPROC_METHOD reaches a TP=2 child unchanged, by the standby too.

RealEffects with a fake NVML of two H200s and the fake vLLM, driven by hand as the loop drives
it (the fixture and helpers are test_standby_gpus.py's).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

pytest.importorskip("vllmwatch.shell.launcher", reason="needs the standby (issue 28)")

from tests.shell import test_standby_gpus as one
from tests.support import dead, wait_for
from tests.support.procs import environ
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.core.actions import CheckRelease, SampleMemory, Sweep
from vllmwatch.shell.effects import RealEffects
from vllmwatch.testing.fake_nvml import FakeNvml

FORK_VARIABLE = "VLLM_WORKER_MULTIPROC_METHOD"  # vllmwatch.config.launch's
two_gpus = one.two_gpus  # the fixture: RealEffects over a fake NVML of two H200s
_config, _spawn, _standby_waiting = one._config, one._spawn, one._standby_waiting


def _on_gpu(config: Config, gpu: int, path: Path, env: dict[str, str] | None = None) -> Config:
    """config for one GPU, under its own config path (its own marker, as two units have)."""
    raw: dict[str, Any] = {
        "vllm": {"command": list(config.vllm.command), "model": "tiny",
                 "port": config.vllm.port + gpu + 1, "gpus": [gpu], "env": env or {}},
        "restart": {"standby": "true"},
        "prewarm": {"enabled": False, "cache_dir": str(path.parent / f"cache{gpu}")},
    }
    return from_dict(raw, path=str(path))


def _tree(pid: int, at_least: int) -> list[int]:
    def found() -> list[int]:
        kids = [p.pid for p in psutil.Process(pid).children(recursive=True)]
        return kids if len(kids) >= at_least else []
    return wait_for(found, 30, f"{at_least} processes under {pid}")


def _stop_tree(fx: RealEffects, config: Config, pid: int) -> None:
    os.killpg(pid, signal.SIGTERM)
    wait_for(lambda: fx.poll_child() is not None, 20, "the old child to exit")
    fx.sweep(Sweep(pid, "127.0.0.1", config.vllm.port, settle=3.0))


def test_tp2_standby_is_outside_the_trees_figure_on_both_gpus(two_gpus: dict[str, Any],
                                                              tmp_path: Path) -> None:
    config = _config(tmp_path, tp=2)
    fx = two_gpus["make"](config)
    first = _spawn(fx, config)
    standby = _standby_waiting(fx, first.pid, config)
    workers = _tree(first.pid, 3)
    nvml: FakeNvml = two_gpus["nvml"]
    nvml.gpus[0].procs = {workers[-2]: 1500.0}
    nvml.gpus[1].procs = {workers[-1]: 1500.0}
    got = fx.sample_memory(SampleMemory(with_pss=False, gpus=(0, 1)), 0).sample
    assert standby not in got.tree_pids and first.pid in got.tree_pids
    assert got.gpu_tree_mib == 3000.0 and got.gpu_tree_by_gpu_mib == {0: 1500.0, 1: 1500.0}
    listed = {p.pid for p in fx.sampler.gpu_processes() or []}
    assert standby not in listed and listed == {workers[-2], workers[-1]}
    assert standby in fx.launcher.exempt()


def test_a_restart_of_one_daemon_leaves_the_other_gpus_standby_alone(
        two_gpus: dict[str, Any], tmp_path: Path) -> None:
    base = _config(tmp_path, tp=1)
    conf = [_on_gpu(base, g, tmp_path / f"gpu{g}.toml") for g in (0, 1)]
    fx = [two_gpus["make"](c) for c in conf]
    kids = [_spawn(f, c) for f, c in zip(fx, conf, strict=True)]
    standbys = [_standby_waiting(f, k.pid, c) for f, k, c in zip(fx, kids, conf, strict=True)]
    b_standby = psutil.Process(standbys[1])
    b_born, b_child = b_standby.create_time(), psutil.Process(kids[1].pid).create_time()
    nvml: FakeNvml = two_gpus["nvml"]
    b_engine = _tree(kids[1].pid, 1)[0]
    nvml.gpus[0].procs, nvml.gpus[1].procs = {kids[0].pid: 1000.0}, {b_engine: 2000.0}
    nvml.gpus[0].used_mib, nvml.gpus[1].used_mib = 1000.0, 2000.0
    gpu1 = (dict(nvml.gpus[1].procs), nvml.gpus[1].used_mib)

    old_a = [kids[0].pid, *_tree(kids[0].pid, 1)]
    _stop_tree(fx[0], conf[0], kids[0].pid)  # a's restart: its tree goes, its GPU frees
    nvml.gpus[0].procs, nvml.gpus[0].used_mib = {}, 0.0
    again = _spawn(fx[0], conf[0])
    assert again.launch == "standby" and again.pid == standbys[0]

    assert psutil.pid_exists(standbys[1]) and b_standby.create_time() == b_born
    assert b_standby.status() != psutil.STATUS_ZOMBIE
    assert fx[1].launcher.info()["standby_state"] == "waiting"
    assert fx[1].launcher.info()["standby_pid"] == standbys[1]
    assert psutil.Process(kids[1].pid).create_time() == b_child and fx[1].poll_child() is None
    assert (nvml.gpus[1].procs, nvml.gpus[1].used_mib) == gpu1  # b's GPU: nobody touched it
    assert all(dead(p) for p in old_a)


def test_release_gates_are_per_daemon_gpu(two_gpus: dict[str, Any], tmp_path: Path) -> None:
    """a's gate looks at GPU 0 only: b's full GPU 1 does not hold a's relaunch."""
    from vllmwatch.shell.memory import make_sampler

    base = _config(tmp_path, tp=1)
    conf = _on_gpu(base, 0, tmp_path / "a.toml")
    fx = two_gpus["make"](conf)
    fx.sampler = make_sampler([0], two_gpus["log"], nvml=two_gpus["nvml"])
    nvml: FakeNvml = two_gpus["nvml"]
    nvml.gpus[1].procs, nvml.gpus[1].used_mib = {424242: 60000.0}, 60000.0
    gate = CheckRelease(old_pids=(4242,), tolerance_mib=512.0)
    assert fx.check_release(gate).released
    nvml.gpus[0].procs = {4242: 800.0}
    assert not fx.check_release(gate).released


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_the_operators_method_reaches_a_tp2_child_and_its_standby_launch(
        two_gpus: dict[str, Any], tmp_path: Path, method: str) -> None:
    base = _config(tmp_path, tp=2)
    raw: dict[str, Any] = {
        "vllm": {"command": list(base.vllm.command), "model": "tiny", "port": base.vllm.port,
                 "gpus": [0, 1], "args": {"tensor-parallel-size": 2},
                 "env": {FORK_VARIABLE: method}},
        "restart": {"standby": "true"},
        "prewarm": {"enabled": False, "cache_dir": str(tmp_path / "cache")},
    }
    config = from_dict(raw)
    fx = two_gpus["make"](config)
    first = _spawn(fx, config)
    assert environ(first.pid)[FORK_VARIABLE] == method
    standby = _standby_waiting(fx, first.pid, config)
    _stop_tree(fx, config, first.pid)
    second = _spawn(fx, config)
    assert second.launch == "standby" and second.pid == standby  # built for that env
