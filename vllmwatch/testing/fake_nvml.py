"""A fake of the `pynvml` module for tests: same function names, same error classes.

Pass an instance where the real module would go (`make_sampler(..., nvml=FakeNvml(...))`).
Figures are set in MiB and reported in bytes, as NVML does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from vllmwatch.testing import fake_gpu

_MIB = 1024 * 1024


class NVMLError(Exception):
    """Base of the fake NVML errors; `value` is the NVML return code, as in pynvml."""

    value = 999

    def __str__(self) -> str:
        return f"{type(self).__name__} (code {self.value})"


class NVMLError_NotSupported(NVMLError):  # pynvml's name
    """NVML_ERROR_NOT_SUPPORTED (3): e.g. memory info on a unified-memory GPU."""

    value = 3


class NVMLError_LibraryNotFound(NVMLError):  # pynvml's name
    """NVML_ERROR_LIBRARY_NOT_FOUND (12): no libnvidia-ml.so."""

    value = 12


class NVMLError_DriverNotLoaded(NVMLError):  # pynvml's name
    """NVML_ERROR_DRIVER_NOT_LOADED (9)."""

    value = 9


class NVMLError_GpuIsLost(NVMLError):  # pynvml's name
    """NVML_ERROR_GPU_IS_LOST (15)."""

    value = 15


class NVMLError_Timeout(NVMLError):  # pynvml's name
    """NVML_ERROR_TIMEOUT (10): no event pending."""

    value = 10


class NVMLError_ResetRequired(NVMLError):  # pynvml's name
    """NVML_ERROR_RESET_REQUIRED (16)."""

    value = 16


@dataclass
class FakeGpu:
    """One device. `used_mib=None` makes memory info NOT_SUPPORTED (DGX Spark).

    `procs` maps pid -> MiB (None = NVML does not know the figure) for compute processes,
    `graphics` the same for graphics processes.
    """

    name: str = "NVIDIA H200"
    total_mib: float = 143771.0
    used_mib: float | None = 0.0
    procs: dict[int, float | None] = field(default_factory=dict)
    graphics: dict[int, float | None] = field(default_factory=dict)
    # Hardware faults: `lost` makes every device call raise GPU_IS_LOST; `xids` are pending
    # Xid events (taken by nvmlEventSetWait_v2); ECC/row-remap/page figures as NVML gives.
    lost: bool = False
    xids: list[int] = field(default_factory=list)
    ecc_uncorrected: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # corr, unc, pending, failure
    pages_pending: int = 0
    # A fake_gpu ledger directory: the device's total and used memory, and its processes,
    # come from what the fake vLLMs write there (the spare's sleep and wake, issue 34).
    ledger: str | None = None
    # False: NVML lists the processes but not their memory (usedGpuMemory None, as in a
    # container that does not share the host's PID namespace)
    figures: bool = True


class FakeNvml:  # method names are pynvml's (camelCase)
    """Stands in for the pynvml module; mutate `gpus`, `fail` and `init_error` freely."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_ResetRequired = NVMLError_ResetRequired

    def __init__(self, gpus: list[FakeGpu] | None = None, init_error: Exception | None = None,
                 driver: str = "580.159") -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.init_error = init_error
        self.driver = driver
        self.fail: dict[str, Exception] = {}  # function name -> error it raises
        self.calls: list[str] = []
        self.initialized = False
        self.freed = 0  # event sets freed

    def _enter(self, name: str, handle: int | None = None) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise self.fail[name]
        if handle is not None and self.gpus[handle].lost:
            raise NVMLError_GpuIsLost()

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise self.init_error
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError_GpuIsLost()
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        self._enter("nvmlDeviceGetName", handle)
        return self.gpus[handle].name

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        gpu = self.gpus[handle]
        if gpu.used_mib is None:
            raise NVMLError_NotSupported()
        total, used = int(gpu.total_mib * _MIB), int(gpu.used_mib * _MIB)
        if gpu.ledger is not None:
            total = int(fake_gpu.device(gpu.ledger)[0] * _MIB)
            used = int((gpu.used_mib + fake_gpu.used(gpu.ledger)) * _MIB)
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        gpu = self.gpus[handle]
        table = {**gpu.procs, **fake_gpu.processes(gpu.ledger)} if gpu.ledger is not None \
            else gpu.procs
        return _procs(table if gpu.figures else dict.fromkeys(table))

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[Any]:
        self._enter("nvmlDeviceGetGraphicsRunningProcesses", handle)
        return _procs(self.gpus[handle].graphics)

    def nvmlEventSetCreate(self) -> list[int]:
        self._enter("nvmlEventSetCreate")
        return []

    def nvmlDeviceRegisterEvents(self, handle: int, types: int, event_set: list[int]) -> None:
        self._enter("nvmlDeviceRegisterEvents", handle)
        event_set.append(handle)

    def nvmlEventSetFree(self, event_set: list[int]) -> None:
        self._enter("nvmlEventSetFree")
        self.freed += 1

    def nvmlEventSetWait_v2(self, event_set: list[int], timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait_v2")
        for handle in event_set:
            if self.gpus[handle].lost:
                raise NVMLError_GpuIsLost()
            if self.gpus[handle].xids:
                return SimpleNamespace(device=handle, eventType=0x8,
                                       eventData=self.gpus[handle].xids.pop(0))
        raise NVMLError_Timeout()

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", handle)
        return self.gpus[handle].ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        self._enter("nvmlDeviceGetRemappedRows", handle)
        return self.gpus[handle].remapped_rows

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int) -> int:
        self._enter("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        return self.gpus[handle].pages_pending


def _procs(table: dict[int, float | None]) -> list[Any]:
    return [SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else int(mib * _MIB))
            for pid, mib in table.items()]
