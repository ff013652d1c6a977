"""Unified memory (DGX Spark / GB10): platform decision, the start guard's decision, and the
diagnosis of vLLM's start-up memory failures, and what the core does with one (start_failed).
Pure: readings and lines in, decisions out.

On unified memory the GPU allocates from system RAM, and `torch.cuda.mem_get_info()` reports
MemFree there: clean page cache (the checkpoint just read) counts as used. See
docs/operations/memory.md "DGX Spark".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from vllmwatch.config.redact import REDACT
from vllmwatch.core.actions import Action, Log
from vllmwatch.core.events import ChildExited
from vllmwatch.core.names import Reason
from vllmwatch.core.state import WatchState

GIB_MIB = 1024.0
# The floor under which the guard acts when memory.guard_floor = 0 (auto): the larger of
# 4 GiB and 5% of MemTotal (6.4 GiB on a 128 GB Spark). Why: vLLM allocates the KV cache
# per layer (about 1-3 GiB each on a Spark-sized budget) and the driver fails an allocation
# it cannot back at once (NV_ERR_NO_MEMORY) rather than waiting for reclaim; a checkpoint
# streamed from NVMe at 3-6 GB/s fills ~6 GiB in one or two of the guard's 1 s samples.
AUTO_FLOOR_MIN_MIB = 4 * GIB_MIB
AUTO_FLOOR_FRACTION = 0.05
# Device names of unified-memory NVIDIA parts: GB10 (DGX Spark), GH200/GB200 superchips
# present the CPU memory coherently too, but they also have their own HBM that NVML reports,
# so only a NotSupported answer decides for them.
UNIFIED_NAMES = ("GB10",)


@dataclass(frozen=True)
class Platform:
    """Whether GPU memory is system memory here, and why we think so."""

    unified: bool
    reason: str  # config | nvml-memory-not-supported | device-name | nvml-memory-info | no-gpu ...
    device: str = ""


def decide_platform(setting: str, names: Iterable[str], memory_info: Iterable[bool | None]
                    ) -> Platform:
    """Decide unified vs discrete from memory.unified and NVML's answers.

    `setting` is "auto" | "true" | "false"; `names` the configured GPUs' names;
    `memory_info` per GPU: True = nvmlDeviceGetMemoryInfo answered, False = NotSupported,
    None = another failure (unknown).
    """
    names, answers = tuple(names), tuple(memory_info)
    device = names[0] if names else ""
    if setting == "true":
        return Platform(True, "config", device)
    if setting == "false":
        return Platform(False, "config", device)
    if not names:
        return Platform(False, "no-gpu", device)
    if answers and all(a is False for a in answers):
        return Platform(True, "nvml-memory-not-supported", device)
    if any(u in n.upper() for n in names for u in UNIFIED_NAMES):
        return Platform(True, "device-name", device)
    if any(a is True for a in answers):
        return Platform(False, "nvml-memory-info", device)
    return Platform(False, "unknown", device)


# --- /proc/meminfo ---------------------------------------------------------------------------

@dataclass(frozen=True)
class MemInfo:
    """The /proc/meminfo figures the guard and check use, in MiB."""

    total_mib: float
    free_mib: float
    available_mib: float
    cached_mib: float = 0.0


def parse_meminfo(text: str) -> MemInfo | None:
    """Parse /proc/meminfo text ("MemFree:  123 kB"); None when a needed line is missing."""
    kib: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            kib[key.strip()] = int(parts[0])
    try:
        return MemInfo(kib["MemTotal"] / 1024, kib["MemFree"] / 1024,
                       kib["MemAvailable"] / 1024, kib.get("Cached", 0) / 1024)
    except KeyError:
        return None


# --- the start guard -------------------------------------------------------------------------

@dataclass(frozen=True)
class GuardSettings:
    """memory.guard_* as the decision needs them."""

    floor_mib: float = 0.0  # 0: auto (floor_for)
    min_gap_s: float = 5.0  # never act more often than this
    drop_caches: bool = False
    compact: bool = False
    may_write_proc: bool = False  # /proc/sys/vm is writable for us (root, not read-only)


def floor_for(settings: GuardSettings, total_mib: float) -> float:
    """The MemFree floor in MiB: the configured one, or the auto floor for this machine."""
    if settings.floor_mib > 0:
        return settings.floor_mib
    return max(AUTO_FLOOR_MIN_MIB, AUTO_FLOOR_FRACTION * total_mib)


def guard_actions(reading: MemInfo, settings: GuardSettings, now: float,
                  last_action_at: float | None) -> tuple[str, ...]:
    """What the guard does now: () or ("evict", ["drop_caches"], ["compact"]).

    Acts only when MemFree is under the floor and the last action is at least min_gap_s
    old. Evicting the checkpoint's own pages needs no privilege and comes first; dropping
    all clean caches and compacting are opt-in and need a writable /proc/sys/vm.
    """
    if reading.free_mib >= floor_for(settings, reading.total_mib):
        return ()
    if last_action_at is not None and now - last_action_at < settings.min_gap_s:
        return ()
    acts = ["evict"]
    if settings.may_write_proc and settings.drop_caches:
        acts.append("drop_caches")
    if settings.may_write_proc and settings.compact:
        acts.append("compact")
    return tuple(acts)


# --- diagnosis of the child's output ---------------------------------------------------------

_NUM = r"([\d.]+)"
# vLLM's start-up free-memory check. vLLM 0.26.0 and 0.32.0 vllm/v1/worker/utils.py
# request_memory(): 'Free memory on device cuda:0 (2.6/121.63 GiB) on startup is less than
# desired GPU memory utilization (0.9, 109.47 GiB). Decrease GPU memory utilization or reduce
# GPU memory used by other processes.' 0.32.0 adds, with weights held by `vllm preload`:
# '... on startup is less than the engine's budget after excluding external process's weights
# (0.9, N GiB) ...'. Older releases (gpu_worker.py) printed no device: 'Free memory on device
# (F/T GiB) on startup ...'.
_FREE_CHECK = re.compile(
    r"Free memory on device\s*\S*\s*\(" + _NUM + r"/" + _NUM + r" GiB\) on startup is less "
    r"than (?:desired GPU memory utilization\s*|the engine's budget[^(]*)\(" + _NUM + r", "
    + _NUM + r" GiB\)")
# Out of memory while loading or profiling. torch: 'torch.OutOfMemoryError: CUDA out of memory.
# Tried to allocate 2.00 GiB. GPU 0 has a total capacity of ...'; the CUDA runtime/driver:
# 'CUDA error: out of memory', 'CUDA driver error: out of memory', 'cudaErrorMemoryAllocation';
# the open kernel module's status on unified memory: 'NV_ERR_NO_MEMORY'; vLLM 0.26.0
# gpu_model_runner.py load_model() (0.32.0 the same): 'Failed to load model - not enough GPU
# memory. Try lowering --gpu-memory-utilization ...'.
_OOM = re.compile(r"CUDA out of memory|CUDA (?:driver )?error: out of memory|"
                  r"cudaErrorMemoryAllocation|NV_ERR_NO_MEMORY|"
                  r"Failed to load model - not enough GPU memory")
# Too little left for the KV cache after profiling. vLLM 0.26.0 and 0.32.0
# vllm/v1/core/kv_cache_utils.py: 'No available memory for the cache blocks. Try increasing
# `gpu_memory_utilization` when initializing the engine.' and '... KV cache is needed, which
# is larger than the available KV cache memory (N GiB). ...'.
_NO_KV = re.compile(r"No available memory for the cache blocks|"
                    r"larger than the available KV cache memory")


@dataclass(frozen=True)
class Diagnosis:
    """A start that failed for memory: the cause and what vLLM said."""

    cause: str  # startup_free_memory | profiling_oom | kv_cache_memory
    line: str
    free_gib: float | None = None
    total_gib: float | None = None
    utilization: float | None = None
    requested_gib: float | None = None


def is_memory_line(line: str) -> bool:
    """Whether a child line is one diagnose() would use (cheap enough for every line)."""
    if "emory" not in line and "NV_ERR" not in line and "cudaError" not in line:
        return False
    return bool(_FREE_CHECK.search(line) or _OOM.search(line) or _NO_KV.search(line))


def diagnose(lines: Iterable[str]) -> Diagnosis | None:
    """The memory cause of a failed start from the child's last lines; None if not memory.

    The free-memory check wins over an OOM seen in the same output (it is the earlier,
    more specific message).
    """
    found: Diagnosis | None = None
    for line in lines:
        m = _FREE_CHECK.search(line)
        if m:
            free, total, util, req = (float(g) for g in m.groups())
            return Diagnosis("startup_free_memory", line.strip(), free, total, util, req)
        if found is None and _OOM.search(line):
            found = Diagnosis("profiling_oom", line.strip())
        elif found is None and _NO_KV.search(line):
            found = Diagnosis("kv_cache_memory", line.strip())
    return found


def reason_detail(d: Diagnosis, page_cache_gib: float | None, unified: bool) -> str:
    """The restart detail and STATUS text: the cause in words, with the numbers we have."""
    if d.cause == "startup_free_memory":
        text = (f"vLLM's start-up check saw {d.free_gib:g} of {d.total_gib:g} GiB free, "
                f"wanted {d.requested_gib:g} GiB (gpu-memory-utilization {d.utilization:g})")
    elif d.cause == "profiling_oom":
        text = "out of memory while loading or profiling"
    else:
        text = "too little memory left for the KV cache after profiling"
    if unified and page_cache_gib is not None:
        text += f"; page cache held {page_cache_gib:.1f} GiB at start"
    return text


def memory_verdict(d: Diagnosis, failures_in_a_row: int, retries: int,
                   unified: bool) -> tuple[str, str]:
    """("retry", detail) or ("stop", what the operator should change).

    `failures_in_a_row` counts this one. On unified memory a retry follows an eviction of
    the checkpoint's pages, which fixes the page-cache case; the same failure `retries`
    more times means the budget itself is wrong.
    """
    if failures_in_a_row <= retries:
        return "retry", "evicting the checkpoint from the page cache and starting again" \
            if unified else "starting again"
    advice = ("set vllm.args.kv-cache-memory-bytes (e.g. \"40G\") and lower "
              "gpu-memory-utilization to what the model needs (vLLM's start-up check still "
              "wants utilization x total free)" if unified else
              "lower vllm.args.gpu-memory-utilization or set kv-cache-memory-bytes")
    return "stop", (f"vLLM failed to start for memory {failures_in_a_row} times in a row "
                    f"({d.cause}): {advice}; check other tenants' memory (nvidia-smi, "
                    "free -g) and memory.guard_floor; then restart vllmwatch")


# --- a start that died for memory: named, counted, stopped (was core/startmem.py) ------------
# A start that died for memory gets a named reason, and stops after repeated tries.
#
# Glue between machine._child_exited and the diagnosis above: the same memory
# failure in consecutive child generations counts up; after memory.start_memory_retries the
# daemon stops with exitcodes.START_MEMORY instead of crash-looping.

MEMORY_REASON = Reason.START_MEMORY


def start_failed(s: WatchState, ev: ChildExited
                 ) -> tuple[WatchState, list[Action], str, bool] | None:
    """(state, log actions, restart detail, stop) when the child's output names a memory
    failure; None otherwise. `stop`: the failure repeated past the retries, and the caller
    halts with exitcodes.START_MEMORY."""
    d = diagnose((*ev.memory_lines, *ev.last_lines))
    if d is None or s.child is None:
        return None
    count, last_gen = s.memory_failures
    n = count + 1 if last_gen == s.child.gen - 1 and count > 0 else 1
    s = replace(s, memory_failures=(n, s.child.gen))
    retries = s.config.memory.start_memory_retries
    verdict, text = memory_verdict(d, n, retries, ev.unified)
    detail = reason_detail(d, ev.page_cache_gib, ev.unified)
    acts: list[Action] = [Log("warning", "start.memory_failure", {
        "cause": d.cause, "detail": detail, "line": REDACT.head(d.line, 300), "failures_in_row": n,
        "retries": retries, "unified": ev.unified, "next": text if verdict == "retry" else
        "stop"})]
    stop = verdict == "stop"
    if stop:  # no restart follows to record the reason: /status shows it as the last one
        s = replace(s, last_reason=MEMORY_REASON, last_detail=detail)
        acts.append(Log("error", "start.memory_gave_up", {"cause": d.cause, "detail": detail,
                                                          "hint": text}))
    return s, acts, detail, stop
