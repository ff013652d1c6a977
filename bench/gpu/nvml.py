"""What NVML sees, for reports: used memory (summed and per GPU) and the compute processes.

The module is passed in (pynvml on the GPU machine, vllmwatch.testing.fake_nvml in the dry
run), so nothing is opened at import.
"""

from __future__ import annotations

import importlib
from typing import Any

from bench.gpu.procs import title


class Nvml:
    """Every GPU the given NVML module sees; `ok` False (and `err` why) when it cannot."""

    def __init__(self, module: Any) -> None:
        self.ok = False
        self.err = ""
        self.hs: list[Any] = []
        self.N = module
        try:
            module.nvmlInit()
            self.hs = [module.nvmlDeviceGetHandleByIndex(i)
                       for i in range(module.nvmlDeviceGetCount())]
            self.ok = True
        except Exception as exc:  # no driver, no library: reports say so
            self.err = f"{type(exc).__name__}: {exc}"

    @classmethod
    def real(cls) -> Nvml:
        """pynvml, or an Nvml that says why not."""
        try:
            return cls(importlib.import_module("pynvml"))
        except ImportError as exc:
            bad = cls(None)
            bad.err = f"ImportError: {exc}"
            return bad

    def used_by_gpu(self) -> list[int]:
        if not self.ok:
            return []
        return [int(self.N.nvmlDeviceGetMemoryInfo(h).used) >> 20 for h in self.hs]

    def used_mib(self) -> int | None:
        return sum(self.used_by_gpu()) if self.ok else None

    def procs(self, gpu: int | None = None) -> list[tuple[int, int]]:
        """(pid, MiB) per process and GPU (a TP process shows once per GPU it holds)."""
        if not self.ok:
            return []
        hs = self.hs if gpu is None else [self.hs[gpu]]
        return [(int(p.pid), int(p.usedGpuMemory or 0) >> 20) for h in hs
                for p in self.N.nvmlDeviceGetComputeRunningProcesses(h)]

    def snapshot(self) -> dict[str, Any]:
        if not self.ok:
            return {"nvml": self.err}
        return {"used_mib": self.used_mib(), "used_by_gpu_mib": self.used_by_gpu(),
                "procs": [{"gpu": i, "pid": pid, "mib": mib, "title": title(pid)}
                          for i in range(len(self.hs)) for pid, mib in self.procs(i)]}
