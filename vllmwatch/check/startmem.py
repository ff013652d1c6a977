"""vLLM's start-up memory check, done ahead by `check` (issue 36.2): a config that vLLM will
refuse at its first start FAILs here, with the value to set.

- CPU (`vllm.gpus = []`): vLLM's CPUWorker asks for `gpu-memory-utilization` x the memory of
  its NUMA node (the flag is a fraction of host memory there) and refuses when that is more
  than the node has available: "Available memory on node 0 ... is less than desired CPU memory
  utilization". Read in vLLM's `cpu_worker.py` / `cpu_resource_utils.get_memory_node_info`
  (available = MemFree + the file pages, per node; psutil's available without nodes).
- GPU: `request_memory()` refuses when a GPU's free memory is below utilization x its total
  (FACTS.md). Unified memory (DGX Spark) has its own row (`unified.startup-check`).
- On CPU the check is skipped when the KV cache is sized in bytes (`kv-cache-memory-bytes`, or
  the legacy VLLM_CPU_KVCACHE_SPACE that vLLM maps onto it): vLLM's CPUWorker skips it then.
  On a GPU it is not: `request_memory()` runs in init_device whatever the KV sizing (vLLM
  0.26/0.32 gpu_worker.py; measured on the H200, issue 34: a spare with 8G of KV bytes still
  needs a small utilization to start beside a serving engine).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from vllmwatch.check.base import FAIL, PASS, WARN, CheckResult, Context, vllm_flags

DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default (0.26, 0.32)
# vLLM's own processes (API server, EngineCore, imports) use this much before the worker asks.
CPU_MARGIN = 3 << 30
GPU_MARGIN = 1 << 30  # the CUDA context and the allocator before request_memory()
_GIB = 1 << 30
NAME = "start memory"
Meminfo = Callable[[], "tuple[int, int] | None"]


def node_memory(root: str = "/") -> tuple[int, int] | None:
    """(total, available) bytes of NUMA node 0 as vLLM's CPU worker reads them, else of the
    machine (/proc/meminfo's MemAvailable); None when neither is readable."""
    path = os.path.join(root, "sys/devices/system/node/node0/meminfo")
    fields: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open(path, encoding="ascii") as fh:
            for line in fh:  # "Node 0 MemTotal:       24684012 kB"
                parts = line.split()
                fields[parts[2].rstrip(":")] = int(parts[3]) * 1024
        return fields["MemTotal"], fields["MemFree"] + fields.get("Active(file)", 0) + \
            fields.get("Inactive(file)", 0)
    with contextlib.suppress(OSError, ValueError, IndexError, KeyError):
        with open(os.path.join(root, "proc/meminfo"), encoding="ascii") as fh:
            for line in fh:
                parts = line.split()
                fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
        return fields["MemTotal"], fields["MemAvailable"]
    return None


def check_start_memory(ctx: Context, meminfo: Meminfo = node_memory,
                       nvml: Callable[[], Any] | None = None) -> list[CheckResult]:
    """FAIL what vLLM's start-up memory check will refuse; WARN what is within its margin."""
    flags = vllm_flags(ctx)
    env = {**ctx.env, **ctx.config.vllm.env}
    cpu = ctx.config.vllm.gpus == []
    if cpu and ("kv-cache-memory-bytes" in flags or env.get("VLLM_CPU_KVCACHE_SPACE", "")):
        return [CheckResult(NAME, PASS, "the KV cache is sized in bytes (kv-cache-memory-bytes"
                            " / VLLM_CPU_KVCACHE_SPACE): vLLM skips its start-up memory "
                            "check on CPU")]
    try:
        util = float(str(flags.get("gpu-memory-utilization", DEFAULT_UTILIZATION)))
    except ValueError:
        return []  # `vllm.args` reports the value
    if cpu:
        return [_cpu(util, meminfo())]
    load = nvml if nvml is not None else ctx.nvml
    return _gpus(util, ctx.config.vllm.gpus, load) if load is not None else []


def _cpu(util: float, memory: tuple[int, int] | None) -> CheckResult:
    if memory is None:
        return CheckResult(NAME, WARN, "cannot read the host's memory (/proc/meminfo): vLLM's "
                           "start-up memory check not done ahead")
    total, available = memory
    want = util * total
    most = max(0.05, (available - CPU_MARGIN) / total) if total else 0.0
    text = (f"CPU deployment: vLLM will reserve gpu-memory-utilization {util:g} x "
            f"{total / _GIB:.1f} GiB of host memory = {want / _GIB:.1f} GiB; "
            f"{available / _GIB:.1f} GiB is available now")
    todo = (f"set vllm.args.gpu-memory-utilization to at most {most:.2f} (on CPU it is a "
            "fraction of host memory), or size the KV cache with kv-cache-memory-bytes")
    if want > available:
        return CheckResult(NAME, FAIL, f"{text}: vLLM will refuse to start (\"less than "
                           f"desired CPU memory utilization\"); {todo}")
    if want > available - CPU_MARGIN:
        return CheckResult(NAME, WARN, f"{text}, and vLLM's own processes take ~3 GiB before "
                           f"it asks: it may refuse to start; {todo}")
    return CheckResult(NAME, PASS, text)


def _gpus(util: float, gpus: list[int] | None, load: Callable[[], Any]) -> list[CheckResult]:
    nvml = load()
    if nvml is None:
        return []  # the gpu rows say NVML is missing
    try:
        nvml.nvmlInit()
    except Exception:  # the gpu rows say why
        return []
    out = []
    try:
        for index in gpus if gpus is not None else range(int(nvml.nvmlDeviceGetCount())):
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(index))
            except Exception:  # absent, or unified memory: other rows cover it
                continue
            want = util * mem.total
            text = (f"GPU {index}: vLLM will ask gpu-memory-utilization {util:g} x "
                    f"{mem.total / _GIB:.1f} GiB = {want / _GIB:.1f} GiB free; "
                    f"{mem.free / _GIB:.1f} GiB is free now")
            todo = (f"free the GPU or set vllm.args.gpu-memory-utilization to at most "
                    f"{max(0.05, (mem.free - GPU_MARGIN) / mem.total):.2f}")
            if want > mem.free:
                out.append(CheckResult(NAME, FAIL, f"{text}: vLLM will refuse to start; {todo}"))
            elif want > mem.free - GPU_MARGIN:
                out.append(CheckResult(NAME, WARN, f"{text}: within its CUDA context of the "
                                       f"limit, it may refuse to start; {todo}"))
            else:
                out.append(CheckResult(NAME, PASS, text))
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return out
