"""GPU checks for `vllmwatch check`, through an injectable pynvml-like module.

The NVML object is anything shaped like the pynvml module (the functions used below, plus
NVMLError and NVML_ERROR_NOT_SUPPORTED), so tests pass a fake with missing GPUs, foreign
processes and unified-memory devices whose memory info is NOT_SUPPORTED (DGX Spark).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from vllmwatch.check.base import FAIL, PASS, WARN, CheckResult
from vllmwatch.shell.child import describe_pid

_MIB = 1 << 20
# Device memory used with no visible process above this is someone else's (another
# container?); below it, it is driver and context overhead.
_UNEXPLAINED_MIB = 1024


def load_nvml() -> Any:
    """The real pynvml module, imported only when a GPU check runs; None if not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def check_gpus(gpus: list[int] | None, load: Callable[[], Any]) -> list[CheckResult]:
    """NVML reachable, driver/CUDA versions, each configured GPU present, its memory free."""
    if gpus is not None and not gpus:
        return [CheckResult("gpu", PASS, "CPU config (vllm.gpus = []): no GPU needed")]
    nvml = load()
    if nvml is None:
        return [CheckResult("nvml", FAIL, "the nvidia-ml-py package is not installed; "
                            "pip install nvidia-ml-py")]
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return [CheckResult("nvml", FAIL, f"NVML not reachable ({exc}): is the NVIDIA driver "
                            "installed and loaded (nvidia-smi)? For a CPU deployment set "
                            "vllm.gpus = []")]
    try:
        return _check_initialised(nvml, gpus)
    finally:
        with contextlib.suppress(Exception):  # best effort; the results are already in
            nvml.nvmlShutdown()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _versions(nvml: Any) -> str:
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    try:
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
        return f"driver {driver}, CUDA {cuda // 1000}.{cuda % 1000 // 10}"
    except Exception:  # older drivers lack the call; the driver version is still useful
        return f"driver {driver}, CUDA version unknown"


def _check_initialised(nvml: Any, gpus: list[int] | None) -> list[CheckResult]:
    count = int(nvml.nvmlDeviceGetCount())
    results = [CheckResult("nvml", PASS if count else FAIL, f"{_versions(nvml)}, {count} GPU(s)"
                           + ("" if count else "; no GPU visible: for a CPU deployment set "
                              "vllm.gpus = []"))]
    for index in (gpus if gpus is not None else range(count)):
        if index >= count:
            seen = {0: "none", 1: "0"}.get(count, f"0-{count - 1}")
            results.append(CheckResult(f"gpu {index}", FAIL, f"configured in vllm.gpus but not "
                                       f"visible (NVML sees {count}: {seen}); fix vllm.gpus"))
            continue
        results += _check_device(nvml, index)
    return results


def _not_supported(nvml: Any, exc: BaseException) -> bool:
    return isinstance(exc, nvml.NVMLError) and (
        getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED)


def _check_device(nvml: Any, index: int) -> list[CheckResult]:
    name = f"gpu {index}"
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    model = _text(nvml.nvmlDeviceGetName(handle))
    used_mib: float | None = None
    try:
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        used_mib = mem.used / _MIB
        line = CheckResult(name, PASS, f"{model}: {used_mib:.0f} / {mem.total / _MIB:.0f} MiB "
                           "used")
    except Exception as exc:
        if not _not_supported(nvml, exc):
            line = CheckResult(name, WARN, f"{model}: memory info unavailable ({exc})")
        else:
            line = CheckResult(name, PASS, f"{model}: unified memory: device memory info not "
                               "supported (per-process and host memory are used instead)")
    return [line, *_check_holders(nvml, handle, name, used_mib)]


def _check_holders(nvml: Any, handle: Any, name: str, used_mib: float | None
                   ) -> list[CheckResult]:
    try:
        procs = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
    except Exception as exc:
        if _not_supported(nvml, exc):
            return []
        return [CheckResult(f"{name} processes", WARN, f"cannot list GPU processes ({exc})")]
    if procs:
        held = ", ".join(f"{describe_pid(p.pid)} {_mib(p.usedGpuMemory)}" for p in procs)
        return [CheckResult(f"{name} processes", WARN, f"GPU memory held by {held} — vLLM may "
                            "not fit; stop them (an old vLLM? `vllmwatch run` removes stale "
                            "ones with restart.kill_stale) or lower gpu-memory-utilization")]
    if used_mib is not None and used_mib > _UNEXPLAINED_MIB:
        return [CheckResult(f"{name} processes", WARN, f"{used_mib:.0f} MiB in use by "
                            "processes not visible here (another container or host user?) — "
                            "vLLM may not fit")]
    return []


def _mib(value: object) -> str:
    if isinstance(value, int):
        return f"{value / _MIB:.0f} MiB"
    return "(amount not reported)"
