"""Read GPU hardware faults from NVML: Xid events, ECC, row remapping, a GPU that is lost.

Each `poll()` returns the faults that are new since the previous one; core/gpufault.py
decides what they mean. Calls the driver does not support are dropped after their first
NOT_SUPPORTED; nothing here raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllmwatch.core.samples import GpuFault

Log = Callable[..., None]
_GPU_IS_LOST, _RESET_REQUIRED, _NOT_SUPPORTED, _TIMEOUT = 15, 16, 3, 10
_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
_UNCORRECTED, _VOLATILE = 1, 0  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


class FaultWatch:
    """Hardware-fault reader over the configured GPUs' NVML handles."""

    def __init__(self, nvml: Any, handles: dict[int, Any], log: Log) -> None:
        self._nvml, self._handles, self._log = nvml, handles, log
        self._unsupported: set[tuple[str, int]] = set()
        self._ecc: dict[int, int] = {}  # first reading: only a rise is news
        self._reported: set[tuple[int, str]] = set()  # standing conditions, reported once
        self._events: dict[int, Any] = {}
        for index, handle in handles.items():
            self._register(index, handle)

    def _register(self, index: int, handle: Any) -> None:
        """An event set per GPU for its Xid events; none where the driver refuses."""
        try:
            event_set = self._nvml.nvmlEventSetCreate()
            self._nvml.nvmlDeviceRegisterEvents(handle, _XID_CRITICAL, event_set)
        except Exception:  # NOT_SUPPORTED (vGPU, some MIG and consumer parts): no Xids
            return
        self._events[index] = event_set

    def poll(self) -> tuple[GpuFault, ...]:
        """Faults new since the last poll, on every configured GPU."""
        found: list[GpuFault] = []
        for index, handle in self._handles.items():
            found += self._xids(index)
            found += self._standing(index, handle)
        # Xids are events; everything else is a standing condition: report each once.
        new = []
        for f in found:
            if f.kind != "xid":
                if (f.gpu_index, f.kind) in self._reported:
                    continue
                self._reported.add((f.gpu_index, f.kind))
            new.append(f)
        return tuple(new)

    def _xids(self, index: int) -> list[GpuFault]:
        event_set = self._events.get(index)
        out: list[GpuFault] = []
        while event_set is not None and len(out) < 64:
            data = self._call("nvmlEventSetWait_v2", index, event_set, 0, quiet=True)
            if data is None or isinstance(data, GpuFault):  # None: timeout, nothing pending
                out += [data] if data is not None else []
                break
            xid = int(data.eventData)
            out.append(GpuFault(index, "xid", xid=xid))
        return out

    def _standing(self, index: int, handle: Any) -> list[GpuFault]:
        out: list[GpuFault] = []
        info = self._call("nvmlDeviceGetMemoryInfo", index, handle, quiet=True)
        ecc = self._call("nvmlDeviceGetTotalEccErrors", index, handle, _UNCORRECTED, _VOLATILE)
        if isinstance(ecc, int):
            base = self._ecc.setdefault(index, ecc)
            if ecc > base:
                self._ecc[index] = ecc
                out.append(GpuFault(index, "ecc_uncorrectable",
                                    f"{ecc - base} new volatile uncorrectable ECC errors"))
        rows = self._call("nvmlDeviceGetRemappedRows", index, handle)
        if isinstance(rows, tuple) and len(rows) == 4 and rows[3]:
            out.append(GpuFault(index, "row_remap_failed", f"uncorrectable rows {rows[1]}"))
        pending = self._call("nvmlDeviceGetRetiredPagesPendingStatus", index, handle)
        # Any call may find the GPU lost or needing a reset: that is the fault to report.
        out += [r for r in (info, ecc, rows, pending) if isinstance(r, GpuFault)][:1]
        if pending == 1 or (isinstance(rows, tuple) and len(rows) == 4 and rows[2]):
            out.append(GpuFault(index, "pages_pending", "memory pages wait for a GPU reset"))
        return out

    def _call(self, fn: str, index: int, *args: Any, quiet: bool = False) -> Any:
        """One NVML call: its result, a GpuFault for a lost GPU, or None."""
        if (fn, index) in self._unsupported:
            return None
        try:
            result = getattr(self._nvml, fn)(*args)
        except Exception as exc:  # a fault reader must never stop the daemon
            code = _code(exc)
            if code == _GPU_IS_LOST:
                return GpuFault(index, "gpu_lost", str(exc))
            if code == _RESET_REQUIRED:
                return GpuFault(index, "reset_required", str(exc))
            if code != _TIMEOUT:
                self._unsupported.add((fn, index))
                if not quiet and code != _NOT_SUPPORTED:
                    self._log("gpu.fault_check_failed", level="info", call=fn, gpu=index,
                              error=str(exc))
            return None
        return result
