"""Know the platform: is GPU memory system memory here (DGX Spark, GB10)? And /proc/meminfo.

The decision is core.unified.decide_platform; this module asks NVML and reads /proc.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from vllmwatch.config.schema import Config
from vllmwatch.core.unified import MemInfo, Platform, decide_platform, parse_meminfo

Log = Callable[..., None]  # log(event, level=..., **fields)
MEMINFO = "/proc/meminfo"
DROP_CACHES = "/proc/sys/vm/drop_caches"
COMPACT_MEMORY = "/proc/sys/vm/compact_memory"


def _load_nvml() -> Any:
    import pynvml  # lazy: optional at run time on CPU hosts

    return pynvml


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_answers(nvml: Any, gpus: list[int] | None) -> tuple[list[str], list[bool | None]]:
    """Names of the configured GPUs and whether nvmlDeviceGetMemoryInfo answers on each.

    True = it answered, False = NotSupported (unified memory), None = another failure.
    Raises when NVML itself cannot be initialised.
    """
    nvml.nvmlInit()
    try:
        indexes = list(range(int(nvml.nvmlDeviceGetCount()))) if gpus is None else gpus
        names: list[str] = []
        answers: list[bool | None] = []
        not_supported = getattr(nvml, "NVMLError_NotSupported", None)
        for index in indexes:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            names.append(_text(nvml.nvmlDeviceGetName(handle)))
            try:
                nvml.nvmlDeviceGetMemoryInfo(handle)
                answers.append(True)
            except Exception as exc:  # classified below; never fatal
                unsupported = isinstance(not_supported, type) and isinstance(exc, not_supported)
                answers.append(False if unsupported else None)
        return names, answers
    finally:
        with contextlib.suppress(Exception):  # NVML counts inits; this undoes ours only
            nvml.nvmlShutdown()


def detect(config: Config, log: Log | None, nvml: Any | None = None) -> Platform:
    """Decide unified vs discrete and log `platform.detected` (when log is given); never
    raises. The daemon calls it once with its log; others (prewarm, check) pass None."""
    setting = config.memory.unified
    names: list[str] = []
    answers: list[bool | None] = []
    error = None
    if config.vllm.uses_gpu and setting == "auto":
        try:
            names, answers = nvml_answers(nvml if nvml is not None else _load_nvml(),
                                          config.vllm.gpus)
        except Exception as exc:  # no driver, no pynvml: discrete unless configured
            error = f"{type(exc).__name__}: {exc}"
    platform = decide_platform(setting, names, answers)
    fields: dict[str, Any] = {"unified": platform.unified, "reason": platform.reason,
                              "device": platform.device or None}
    if error:
        fields["nvml_error"] = error
        fields["hint"] = "set memory.unified = true on a DGX Spark if NVML is not reachable"
    if log is not None:
        log("platform.detected", level="info", **fields)
    return platform


def read_meminfo(path: str = MEMINFO) -> MemInfo | None:
    """/proc/meminfo parsed; None when unreadable."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return parse_meminfo(f.read())
    except OSError:
        return None


def may_write_vm() -> bool:
    """Whether /proc/sys/vm/drop_caches is writable for us (root, /proc/sys not read-only)."""
    return os.access(DROP_CACHES, os.W_OK)


def write_vm(path: str, value: str = "1") -> str | None:
    """Write to a /proc/sys/vm knob; None on success, else the error text."""
    try:
        with open(path, "w", encoding="ascii") as f:
            f.write(value)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    return None
