"""Sampling with a fake NVML and a real process tree; the GPU release gate."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace

import psutil
import pytest

from tests.support import TIMEOUT_SCALE, owned, wait_until
from vllmwatch.config.schema import MemoryConfig
from vllmwatch.core import leak
from vllmwatch.core import restart as gpu_release
from vllmwatch.core.samples import GpuProcess, MemorySample
from vllmwatch.shell import memory
from vllmwatch.shell.memory import make_sampler, tree_pids
from vllmwatch.testing.driver import LogCapture
from vllmwatch.testing.fake_nvml import (
    FakeGpu,
    FakeNvml,
    NVMLError_GpuIsLost,
    NVMLError_LibraryNotFound,
)

MIB = 1024 * 1024

# The child starts a grandchild (as vLLM's API server starts EngineCore) that touches ~100 MiB.
_GRANDCHILD = (
    "import sys, time\n"
    "block = b'\\x01' * (100 * 1024 * 1024)\n"
    "open(sys.argv[1], 'w').write('ready')\n"
    "while True:\n"
    "    time.sleep(3600)\n"  # a lifetime, not a wait: its owner kills it
)
_CHILD = (
    "import subprocess, sys\n"
    "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]]).wait()\n"
)


Events = LogCapture


def wait_for(cond: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    wait_until(cond, timeout * TIMEOUT_SCALE, what)  # a loaded box is slow


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """(child pid, grandchild pid) of a live tree whose grandchild holds ~100 MiB."""
    ready = tmp_path_factory.mktemp("tree") / "ready"
    with owned([sys.executable, "-c", _CHILD, _GRANDCHILD, str(ready)]) as child:
        wait_for(ready.exists, what="the grandchild to allocate")
        grandchild = psutil.Process(child.pid).children()[0].pid
        yield child.pid, grandchild


def direct_rss_mib(pids: list[int]) -> float:
    return sum(psutil.Process(p).memory_info().rss for p in pids) / MIB


# ---- the real process tree ----

def test_real_tree_host_memory_matches_psutil(tree: tuple[int, int]) -> None:
    child, grandchild = tree
    sampler = make_sampler([], Events())
    sample = sampler.sample(child, with_pss=True)
    direct = direct_rss_mib([child, grandchild])
    assert set(sample.tree_pids) == {child, grandchild} and sample.tree_pids[0] == child
    assert sample.host_rss_mib >= 100
    # Two readings a moment apart of processes that do nothing: a few MiB at most.
    assert abs(sample.host_rss_mib - direct) < 8
    assert sample.host_pss_mib is not None and 100 <= sample.host_pss_mib <= sample.host_rss_mib
    assert sample.source == "none" and sample.gpu_tree_mib is None and sample.gpu_rule_mib is None
    assert sample.host_rule_mib == sample.host_pss_mib


def test_real_tree_cpu_seconds(tree: tuple[int, int]) -> None:
    child, grandchild = tree
    sample = make_sampler([], Events()).sample(child, with_pss=False)
    direct = sum(sum(psutil.Process(p).cpu_times()[:2]) for p in (child, grandchild))
    assert sample.tree_cpu_s is not None and 0 < sample.tree_cpu_s <= direct + 0.5
    assert make_sampler([], Events()).sample(None, with_pss=False).tree_cpu_s is None


def test_real_tree_without_pss_and_without_root(tree: tuple[int, int]) -> None:
    sampler = make_sampler([], Events())
    assert sampler.sample(tree[0], with_pss=False).host_pss_mib is None
    empty = sampler.sample(None, with_pss=True)
    assert (empty.tree_pids, empty.host_rss_mib, empty.host_pss_mib) == ((), 0.0, 0.0)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30 * TIMEOUT_SCALE)
    assert tree_pids(dead.pid) == ()


# ---- fake NVML ----

def test_discrete_gpus_sum_the_tree_per_process(tree: tuple[int, int]) -> None:
    child, grandchild = tree
    # TP=2: a worker per GPU; a foreign process on GPU 0 must not count.
    nvml = FakeNvml([FakeGpu(used_mib=30000, procs={grandchild: 20000, 424242: 9000}),
                     FakeGpu(used_mib=21000, procs={child: 500})])
    nvml.gpus[1].graphics = {child: 500}  # listed twice: count once
    log = Events()
    sampler = make_sampler(None, log, nvml=nvml)
    sample = sampler.sample(child, with_pss=False)
    assert sample.source == "nvml-process"
    assert sample.gpu_tree_mib == 20500 and sample.gpu_tree_by_gpu_mib == {0: 20000, 1: 500}
    assert sample.device_used_mib == {0: 30000, 1: 21000}
    assert sample.device_total_mib == {0: 143771, 1: 143771}
    assert sample.gpu_rule_mib == 20500
    assert sorted((p.pid, p.gpu_index) for p in sampler.gpu_processes() or []) == sorted(
        [(grandchild, 0), (424242, 0), (child, 1)])
    assert log.named("memory.source") == [
        {"level": "info", "source": "nvml-process", "previous": None, "gpus": [0, 1]}]
    assert sampler.describe() == {"driver": "580.159", "gpus": {0: "NVIDIA H200",
                                                                1: "NVIDIA H200"}}


def test_a_leak_in_one_tp_worker_fires_the_growth_rule_on_the_tree_sum(
        tree: tuple[int, int]) -> None:
    """TP=2 (issue 17): a worker per GPU; one leaks, the other is flat. The sampler's rule
    figure is the tree's sum over both GPUs, and the pure growth rule fires on it after
    `sustain` samples over the limit, naming the GPU figure; a foreign process growing on
    the same GPU does not count."""
    child, grandchild = tree  # the "engine" on GPU 1, the "worker" on GPU 0
    nvml = FakeNvml([FakeGpu(used_mib=40000, procs={grandchild: 30000, 424242: 5000}),
                     FakeGpu(used_mib=31000, procs={child: 30000})])
    sampler = make_sampler(None, Events(), nvml=nvml)
    cfg = replace(MemoryConfig(), sample_interval=10, baseline_delay=0, sustain=3,
                  gpu_growth_limit=1024.0)
    state, fired, sums = leak.new_state(0.0), None, []
    for i in range(12):
        sample = sampler.sample(child, with_pss=False)
        assert sample.gpu_tree_by_gpu_mib is not None
        sums.append((sample.gpu_rule_mib, dict(sample.gpu_tree_by_gpu_mib)))
        state, verdict = leak.observe(state, cfg, 10.0 * i, sample.gpu_rule_mib, None)
        if verdict is not None:
            fired = (i, verdict)
            break
        nvml.gpus[0].procs[grandchild] = 30000 + 400.0 * (i + 1)  # the worker leaks
        nvml.gpus[0].procs[424242] = 5000 + 9000.0 * (i + 1)  # a neighbour grows more
    assert sums[0] == (60000, {0: 30000, 1: 30000})
    assert fired is not None, sums
    i, verdict = fired
    # Over 1024 MiB from the 3rd growth step (+1200), held for 3 samples: index 5.
    assert (i, verdict.reason, verdict.rule) == (5, "gpu_memory", "gpu_growth_limit"), verdict
    assert sums[-1] == (62000, {0: 32000, 1: 30000})


def test_configured_gpu_subset_only(tree: tuple[int, int]) -> None:
    child, grandchild = tree
    nvml = FakeNvml([FakeGpu(used_mib=1, procs={child: 700}),
                     FakeGpu(used_mib=2, procs={grandchild: 300})])
    sample = make_sampler([1], Events(), nvml=nvml).sample(child, with_pss=False)
    assert sample.gpu_tree_by_gpu_mib == {1: 300} and sample.device_used_mib == {1: 2}


def test_unified_memory_not_supported_uses_per_process(tree: tuple[int, int]) -> None:
    child, grandchild = tree
    nvml = FakeNvml([FakeGpu(name="NVIDIA GB10", used_mib=None, procs={grandchild: 4096})])
    log = Events()
    sampler = make_sampler(None, log, nvml=nvml)
    sample = sampler.sample(child, with_pss=False)
    # Unified memory: the tree's own memory, NVML's per-process figure on top of its RSS.
    assert sample.source == "unified" and sample.gpu_tree_mib == 4096
    assert sample.gpu_rule_mib == sample.host_rss_mib + 4096
    assert sample.device_used_mib == {} and sample.device_total_mib == {}
    assert sampler.device_used_mib() == {}
    sampler.sample(child, with_pss=False)
    failed = log.named("memory.nvml_call_failed")
    assert len(failed) == 1 and failed[0]["not_supported"] and failed[0]["level"] == "info"


def test_unknown_per_process_figure_falls_back_to_device(tree: tuple[int, int]) -> None:
    child, grandchild = tree
    nvml = FakeNvml([FakeGpu(used_mib=5000, procs={grandchild: None}),
                     FakeGpu(used_mib=7000, procs={})])
    sample = make_sampler(None, Events(), nvml=nvml).sample(child, with_pss=False)
    assert sample.source == "nvml-device" and sample.gpu_tree_mib is None
    assert sample.gpu_rule_mib == 12000


def test_unified_and_no_per_process_figure_falls_back_to_host(tree: tuple[int, int]) -> None:
    child, grandchild = tree
    nvml = FakeNvml([FakeGpu(used_mib=None, procs={grandchild: None})])
    sample = make_sampler(None, Events(), nvml=nvml).sample(child, with_pss=True)
    assert sample.source == "unified" and sample.gpu_tree_mib is None
    assert sample.gpu_rule_mib == sample.host_pss_mib and sample.host_pss_mib is not None


def test_unknown_figure_of_a_foreign_process_does_not_matter(tree: tuple[int, int]) -> None:
    child, _ = tree
    nvml = FakeNvml([FakeGpu(used_mib=100, procs={child: 64, 424242: None})])
    sample = make_sampler(None, Events(), nvml=nvml).sample(child, with_pss=False)
    assert sample.source == "nvml-process" and sample.gpu_tree_mib == 64


def test_failing_call_gives_unknown_warns_once_and_source_change_is_logged(
        tree: tuple[int, int]) -> None:
    child, _ = tree
    nvml = FakeNvml([FakeGpu(used_mib=100, procs={child: 64})])
    log = Events()
    sampler = make_sampler(None, log, nvml=nvml)
    assert sampler.sample(child, with_pss=False).source == "nvml-process"
    nvml.fail["nvmlDeviceGetComputeRunningProcesses"] = NVMLError_GpuIsLost()
    for _ in range(3):
        sample = sampler.sample(child, with_pss=False)
        assert sample.source == "nvml-device" and sample.gpu_tree_mib is None
    assert sampler.gpu_processes() is None
    nvml.fail["nvmlDeviceGetMemoryInfo"] = NVMLError_GpuIsLost()
    assert sampler.sample(child, with_pss=False).source == "host"
    failed = log.named("memory.nvml_call_failed")
    assert [f["call"] for f in failed] == ["nvmlDeviceGetComputeRunningProcesses",
                                           "nvmlDeviceGetMemoryInfo"]
    assert all(f["level"] == "warning" and not f["not_supported"] for f in failed)
    assert [f["source"] for f in log.named("memory.source")] == [
        "nvml-process", "nvml-device", "host"]


@pytest.mark.parametrize("make", [
    lambda: FakeNvml(init_error=NVMLError_LibraryNotFound()),
    lambda: FakeNvml(gpus=[]),
])
def test_no_nvml_turns_gpu_rules_off_with_one_warning(make: Callable[[], FakeNvml],
                                                      tree: tuple[int, int]) -> None:
    log = Events()
    sampler = make_sampler(None, log, nvml=make())
    for _ in range(2):
        sample = sampler.sample(tree[0], with_pss=False)
        assert sample.source == "none" and sample.gpu_rule_mib is None
        assert sample.host_rss_mib > 100
    assert sampler.gpu_processes() is None and sampler.device_used_mib() == {}
    assert len(log.named("memory.nvml_unavailable")) == 1
    assert log.named("memory.nvml_unavailable")[0]["level"] == "warning"


def test_bad_gpu_index_is_reported_not_raised() -> None:
    log = Events()
    sampler = make_sampler([3], log, nvml=FakeNvml([FakeGpu()]))
    assert sampler.sample(None, with_pss=False).source == "none"
    assert "GpuIsLost" in log.named("memory.nvml_unavailable")[0]["error"]


def test_pynvml_import_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    log = Events()
    assert make_sampler(None, log).sample(None, with_pss=False).source == "none"
    assert "import of pynvml" in log.named("memory.nvml_unavailable")[0]["error"]


def test_real_pynvml_on_this_machine_never_raises() -> None:
    log = Events()
    sample = make_sampler(None, log).sample(os.getpid(), with_pss=False)
    if log.named("memory.nvml_unavailable"):  # a machine without an NVIDIA driver
        assert sample.source == "none"
    else:
        assert sample.source in {"nvml-process", "nvml-device", "host"}


def test_cpu_deployment_never_touches_nvml() -> None:
    nvml = FakeNvml()
    log = Events()
    sample = make_sampler([], log, nvml=nvml).sample(None, with_pss=False)
    assert sample.source == "none" and nvml.calls == []
    assert log.named("memory.nvml_unavailable") == []


def test_memory_sample_rule_figures() -> None:
    s = MemorySample(source="host", tree_pids=(1,), gpu_tree_mib=None, host_rss_mib=300.0)
    assert s.gpu_rule_mib == 300.0 and s.host_rule_mib == 300.0


# ---- GPU release gate ----

P = GpuProcess


@pytest.mark.parametrize(("procs", "used", "before", "ok", "says"), [
    ([], {0: 600.0}, {0: 500.0}, True, "back within 512 MiB on GPU 0"),
    ([P(11, 0, 1000.0)], {0: 600.0}, {0: 500.0}, False, "pid 11 on GPU 0"),
    ([P(99, 0, 1000.0)], {0: 600.0}, {0: 500.0}, True, "no old process"),
    ([], {0: 2000.0}, {0: 500.0}, False, "GPU 0 uses 2000 MiB, 1500 MiB above"),
    ([], {0: 600.0, 1: 9000.0}, {0: 500.0, 1: 400.0}, False, "GPU 1 uses 9000"),
    ([], {}, {0: 500.0}, True, "no old process on the GPU"),  # unified memory
    (None, {0: 600.0}, {0: 500.0}, True, "back within"),
    (None, {0: 6000.0}, {0: 500.0}, False, "GPU 0 uses"),
    (None, {}, {}, True, "cannot verify"),
    ([], {0: 600.0, 1: 700.0}, {0: 500.0}, True, "on GPU 0"),  # GPU 1 not measured before
    ([P(12, 1, None)], {}, {}, False, "pid 12 on GPU 1"),
])
def test_released(procs: list[GpuProcess] | None, used: dict[int, float],
                  before: dict[int, float], ok: bool, says: str) -> None:
    got, detail = gpu_release.released({11, 12}, procs, used, before, 512.0)
    assert got is ok and says in detail


def test_release_check_reads_the_sampler(tree: tuple[int, int]) -> None:
    grandchild = tree[1]
    nvml = FakeNvml([FakeGpu(used_mib=20000, procs={grandchild: 19000})])
    sampler = make_sampler(None, Events(), nvml=nvml)
    assert memory.release_check(sampler, {grandchild}, {0: 1000.0}, 512.0)[0] is False
    nvml.gpus[0] = FakeGpu(used_mib=1100, procs={})
    assert memory.release_check(sampler, {grandchild}, {0: 1000.0}, 512.0) == (
        True, "no old process on the GPU; device memory back within 512 MiB on GPU 0")

