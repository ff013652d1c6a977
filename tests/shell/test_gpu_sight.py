"""NVML's process list blind to the tree (a container without the host's PID namespace): the
GPU rules fall back to the device's figure, said once, never a silent 0 MiB; a tree with
genuinely nothing on the GPU yet stays on the per-process figure."""

from __future__ import annotations

import os
import subprocess
import sys

from vllmwatch.config.schema import from_dict
from vllmwatch.core import leak
from vllmwatch.core.samples import gpu_figure
from vllmwatch.shell.memory import NvmlSampler, make_sampler
from vllmwatch.testing.driver import LogCapture
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml

BEFORE = {0: 600.0}  # the device's use before the launch (another tenant's context)
ME = os.getpid()  # the "tree": this test process


def _sampler(gpu: FakeGpu) -> tuple[NvmlSampler, LogCapture]:
    log = LogCapture()
    return make_sampler([0], log, nvml=FakeNvml([gpu])), log


def test_tree_under_host_pids_falls_back_to_the_device_and_the_limit_fires() -> None:
    # vLLM's engine holds 118 GiB, listed by NVML under its host pid (not one of ours)
    gpu = FakeGpu(used_mib=120_000.0, procs={4_000_000 + ME: 118_000.0})
    sampler, log = _sampler(gpu)
    sample = sampler.sample(ME, False, before_launch=BEFORE)
    assert sample.source == "nvml-device" and sample.gpu_tree_mib is None
    assert gpu_figure(sample, 0.0) == 120_000.0
    cfg = from_dict({"vllm": {"model": "/m", "gpus": [0]},
                     "memory": {"gpu_limit": "100GiB", "sustain": 1,
                                "baseline_delay": "1s"}}).memory
    state, verdict = leak.new_state(0.0), None
    for t in range(5, 50, 5):
        state, verdict = leak.observe(state, cfg, float(t), gpu_figure(sample, 0.0), None)
        if verdict:
            break
    assert verdict is not None
    said = log.named("memory.source")
    assert [s["level"] for s in said] == ["warning"], said
    assert "PID namespace" in said[0]["why"] and "hostPID" in said[0]["hint"]
    assert said[0]["source"] == "nvml-device"


def test_no_process_listed_falls_back_and_stays_without_flapping() -> None:
    gpu = FakeGpu(used_mib=129_393.9, procs={})  # NVML lists no process at all
    sampler, log = _sampler(gpu)
    for _ in range(4):
        sample = sampler.sample(ME, False, before_launch=BEFORE)
        assert sample.source == "nvml-device" and sample.gpu_tree_mib is None
    # the device drops back near its figure before the launch (vLLM asleep, a restart): the
    # source stays, the same samples never flip back and forth
    gpu.used_mib = 700.0
    assert sampler.sample(ME, False, before_launch=BEFORE).source == "nvml-device"
    assert sampler.sample(None, False).source == "nvml-device"  # no tree: nothing learnt
    assert len(log.named("memory.source")) == 1


def test_genuinely_nothing_on_the_gpu_at_start_stays_per_process() -> None:
    gpu = FakeGpu(used_mib=650.0, procs={})  # vLLM not on the GPU yet
    sampler, log = _sampler(gpu)
    sample = sampler.sample(ME, False, before_launch=BEFORE)
    assert sample.source == "nvml-process" and sample.gpu_tree_mib == 0.0
    # then vLLM allocates, listed under our pid: still per process, no warning
    gpu.used_mib, gpu.procs = 80_600.0, {ME: 80_000.0}
    sample = sampler.sample(ME, False, before_launch=BEFORE)
    assert sample.source == "nvml-process" and sample.gpu_tree_mib == 80_000.0
    assert [s["source"] for s in log.named("memory.source")] == ["nvml-process"]


def test_without_a_figure_before_the_launch_nothing_is_decided() -> None:
    gpu = FakeGpu(used_mib=120_000.0, procs={})
    sampler, _ = _sampler(gpu)
    assert sampler.sample(ME, False, before_launch={}).source == "nvml-process"


def test_the_tree_listed_again_ends_the_fallback() -> None:
    gpu = FakeGpu(used_mib=120_000.0, procs={})
    sampler, log = _sampler(gpu)
    assert sampler.sample(ME, False, before_launch=BEFORE).source == "nvml-device"
    gpu.procs = {ME: 119_000.0}  # NVML sees the tree after all (host pids after a move)
    sample = sampler.sample(ME, False, before_launch=BEFORE)
    assert sample.source == "nvml-process" and sample.gpu_tree_mib == 119_000.0
    assert [s["level"] for s in log.named("memory.source")] == ["warning", "info"]


def test_another_process_of_ours_listed_is_no_blind_spot() -> None:
    # NVML lists a process under vllmwatch (the spare's engine) and not the tree yet: NVML
    # sees our PID namespace, the memory above is that process's, the tree holds nothing
    # a lifetime, not a wait: its owner kills it
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    with subprocess.Popen(sleep) as tree, subprocess.Popen(sleep) as spare:
        try:
            gpu = FakeGpu(used_mib=30_000.0, procs={spare.pid: 29_000.0})
            sampler, log = _sampler(gpu)
            sample = sampler.sample(tree.pid, False, before_launch=BEFORE)
            assert sample.source == "nvml-process" and sample.gpu_tree_mib == 0.0
            assert not [s for s in log.named("memory.source") if s["level"] == "warning"]
        finally:
            tree.kill()
            spare.kill()


def test_blind_with_the_spare_alive_the_gpu_rules_wait() -> None:
    # A spare's build shares the GPU; NVML cannot see it either, so its memory cannot be
    # taken out of the device's figure: no GPU figure (the rules wait), said why
    gpu = FakeGpu(used_mib=120_000.0, procs={})
    sampler, log = _sampler(gpu)
    assert sampler.sample(ME, False, before_launch=BEFORE).source == "nvml-device"
    sample = sampler.sample(ME, False, before_launch=BEFORE, spare={4321})
    assert sample.source == "none" and gpu_figure(sample, 0.0) is None
    assert sampler.sample(ME, False, before_launch=BEFORE).source == "nvml-device"  # gone
    said = log.named("memory.source")
    assert [(s["source"], s["level"]) for s in said] == [
        ("nvml-device", "warning"), ("none", "info"), ("nvml-device", "info")], said
    assert "spare" in said[1]["why"]


def test_tree_figure_unknown_with_the_spare_alive_the_gpu_rules_wait() -> None:
    # NVML sees our pids, but one of the tree's processes has no figure (or the process list
    # failed): the device's figure would stand in, and it holds the spare's memory (asleep,
    # or a whole model while it builds), which the rules would read as the tree's growth.
    spare = 4_000_001
    gpu = FakeGpu(used_mib=63_500.0, procs={ME: None, spare: 3_000.0})
    sampler, log = _sampler(gpu)
    assert sampler.sample(ME, False, before_launch=BEFORE).source == "nvml-device"  # no spare
    sample = sampler.sample(ME, False, before_launch=BEFORE, spare={spare})
    assert sample.source == "none" and gpu_figure(sample, 0.0) is None
    said = log.named("memory.source")
    assert said[-1]["source"] == "none" and "spare" in said[-1]["why"]
    assert "cannot see" not in said[-1]["why"]  # not the blind container's words
    gpu.procs[ME] = 60_000.0  # the figure is back: the tree's own sum, the spare left out
    sample = sampler.sample(ME, False, before_launch=BEFORE, spare={spare})
    assert sample.source == "nvml-process" and sample.gpu_tree_mib == 60_000.0
