"""The spare's GPU follows the config (issue 34 leftover 2): vllm.gpus may change by a reload
(a restart of the serving engine on the new GPU, and a rebuilt spare); the spare's free
memory for its wake, the release gate's device figure without the spare and the re-plan's
machine figures then read the new GPU, not the one decided at the daemon's start."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.support.models import spare_config
from vllmwatch.config.schema import Config
from vllmwatch.shell import sparefx
from vllmwatch.shell.memory import make_sampler
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml, NVMLError
from vllmwatch.testing.world import LogCapture

GPU0 = FakeGpu(total_mib=143771.0, used_mib=100_000.0)  # another user's engine on GPU 0
GPU1 = FakeGpu(name="NVIDIA H100", total_mib=81559.0, used_mib=1_000.0)


def _config(tmp: Path, gpus: list[int]) -> Config:
    return spare_config(tmp, vllm={"gpus": gpus})


def test_free_memory_release_figure_and_plan_read_the_current_configs_gpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    on0, on1 = _config(tmp_path, [0]), _config(tmp_path, [1])
    log = LogCapture()
    sampler = make_sampler([0, 1], log, nvml=FakeNvml([GPU0, GPU1]))
    fx = sparefx.make(on0, {"STATE_DIRECTORY": str(tmp_path / "state")}, sampler, False, log)
    assert fx is not None, log.named("spare.plan")
    assert fx.tree._free() == pytest.approx(143771.0 - 100_000.0)
    fx.use(on1)  # a reload moved vLLM to GPU 1 (the launch or the rebuild takes the config)
    assert fx.config is on1
    assert fx.tree._free() == pytest.approx(81559.0 - 1_000.0), "GPU 0's figure after a move"
    fx.tree.memory_mib = lambda: 500.0  # type: ignore[method-assign]  # the spare's tree
    assert fx.device_used(sampler) == {0: 100_000.0, 1: 500.0}, "not taken off GPU 0"
    plans = log.named("spare.plan")
    assert len(plans) == 2 and plans[1]["serving_before"] == plans[0]["serving_before"]
    # GPU 0: 140 GiB with 98 GiB of another's: the serving engine lowered to 0.19; GPU 1: 80
    # GiB, 1 GiB used: 0.78, and the same spare is a larger fraction of the smaller GPU
    assert (plans[0]["serving_after"], plans[1]["serving_after"]) == (0.19, 0.78), plans
    assert plans[1]["spare_utilization"] > plans[0]["spare_utilization"]


def test_a_gpu_the_sampler_does_not_watch_is_unknown_never_another_gpus_figure(
        tmp_path: Path) -> None:
    sampler = make_sampler([0], LogCapture(), nvml=FakeNvml([GPU0, GPU1]))
    assert sparefx.free_mib(sampler, _config(tmp_path, [1])) is None
    assert sparefx.free_mib(sampler, _config(tmp_path, [0])) == pytest.approx(43771.0)


def test_the_spares_inputs_are_stable_and_a_rewritten_key_file_changes_only_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a reload's worker digests (SpareFx.inputs) equals what the build ran (digest of
    the tree's command) while nothing changed (a reload is no rebuild), and a key file
    rewritten in place changes the API key's part alone (issue 34 leftover 1)."""
    from vllmwatch.core.failover import changed
    from vllmwatch.shell.sparerun import digest

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    key = tmp_path / "key"
    key.write_text("sk-first-key-0123456789\n")
    key.chmod(0o600)
    config = dataclasses.replace(_config(tmp_path, [0]), vllm=dataclasses.replace(
        _config(tmp_path, [0]).vllm, api_key_file=str(key)))
    sampler = make_sampler([0, 1], LogCapture(), nvml=FakeNvml([GPU0, GPU1]))
    fx = sparefx.make(config, {"STATE_DIRECTORY": str(tmp_path / "state")}, sampler, False,
                      LogCapture())
    assert fx is not None
    built = digest(fx.tree.cmd)
    assert fx.inputs(config) == fx.inputs(config) == built
    key.write_text("sk-second-key-9876543210\n")  # same path, new key
    assert changed(built, fx.inputs(config)) == "the API key changed"


def test_after_a_move_the_spare_reads_the_sampler_of_the_launch_at_hand(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vllmwatch started with vllm.gpus = [0] samples GPU 0 only; a reload moves vLLM to GPU 1
    and the launch makes a sampler for it (RealEffects.spawn). The re-plan reads GPU 1's
    total in the start's view of every GPU (`machine`), and the wake's free memory and the
    spare's figure read the launch's sampler (`current`): before, the plan went off with
    "the GPU's total memory is unknown (NVML not readable)" and no failover was tried."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    on0, on1 = _config(tmp_path, [0]), _config(tmp_path, [1])
    nvml = FakeNvml([GPU0, dataclasses.replace(GPU1, procs={4242: 1_000.0})])
    now = {"sampler": make_sampler([0], LogCapture(), nvml=nvml)}
    machine = make_sampler(None, LogCapture(), nvml=nvml).sample(None, False)
    log = LogCapture()
    fx = sparefx.make(on0, {"STATE_DIRECTORY": str(tmp_path / "state")}, now["sampler"],
                      False, log, current=lambda: now["sampler"], machine=machine)
    assert fx is not None
    assert fx.tree._free() == pytest.approx(143771.0 - 100_000.0)
    now["sampler"] = make_sampler([1], LogCapture(), nvml=nvml)  # the move's launch
    fx.use(on1)
    plans = log.named("spare.plan")
    assert [p["on"] for p in plans] == [True, True], plans
    assert plans[1]["serving_after"] == 0.78, plans[1]  # GPU 1's 80 GiB, 1 GiB used
    assert fx.tree._free() == pytest.approx(81559.0 - 1_000.0)
    assert fx.tree._gpu_of({4242}) == 1_000.0  # GPU 1's processes are read
    assert fx.tree._gpu_of(set()) is None  # none of them the spare's: unknown, never 0


def test_the_spares_figure_is_unknown_unless_nvml_gives_every_process_of_it() -> None:
    """A 0 for a process NVML does not list, or lists without its memory, would pass the
    wake's room check with no room: the figure is None (unknown) then, and the wake says no."""
    from vllmwatch.core.failover import room

    nvml = FakeNvml([dataclasses.replace(GPU1, procs={10: 2_000.0, 11: None, 12: 500.0})])
    sampler = make_sampler([0], LogCapture(), nvml=nvml)
    assert sparefx._gpu_of(sampler, {10, 12}) == 2_500.0
    assert sparefx._gpu_of(sampler, {10, 11}) is None, "one figure missing: unknown"
    assert sparefx._gpu_of(sampler, {99}) is None, "not listed: unknown"
    assert not room(80_000.0, sparefx._gpu_of(sampler, {99}), None)[0]
    assert sparefx._listing(sampler, {99}) == (None, True), "NVML answered: without us"
    nvml.fail["nvmlDeviceGetComputeRunningProcesses"] = NVMLError(999)  # NVML_ERROR_UNKNOWN
    assert sparefx._listing(sampler, {10, 12}) == (None, False), "the call failed"
