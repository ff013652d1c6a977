"""What NVML shows beyond the memory figures: GPU hardware faults (Xid events, ECC, row
remapping, a GPU that is lost), and whether its process list sees vLLM's tree at all.

Each `poll()` returns the faults that are new since the previous one; core/gpufault.py
decides what they mean. A call the driver can never answer (NOT_SUPPORTED, NO_PERMISSION, a
pynvml without it) is dropped after its first answer; any other error (UNKNOWN, a busy
driver) is asked again at the next poll, or one transient error would hide every later ECC
error, Xid or lost GPU for good (the Xid events' registration included). Nothing here raises.

Whether NVML's process list can see vLLM's tree, and the tree's share of it.

NVML names processes by the pid the driver sees: the host's. In a container without the
host's PID namespace (Kubernetes without `hostPID`, Docker without `--pid=host`) it lists
vLLM's processes under pids that are not ours, or lists none at all (what nvidia-smi shows
there). The tree's per-process sum is then 0 MiB while the device fills up: a figure the GPU
rules would watch forever without firing. `Sight` tells that case apart from a start where
the tree genuinely holds nothing yet, and the sampler falls back to the device's figure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import psutil

from vllmwatch.core.samples import GpuFault, GpuProcess
from vllmwatch.logfn import LogFn

_GPU_IS_LOST, _RESET_REQUIRED, _NOT_SUPPORTED, _TIMEOUT = 15, 16, 3, 10
# NVML return codes that mean "never on this part/driver/user": INVALID_ARGUMENT,
# NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND, VGPU_ECC_NOT_SUPPORTED,
# ARGUMENT_VERSION_MISMATCH, DEPRECATED (nvml.h). None: no code at all (AttributeError: this
# pynvml lacks the call).
_NEVER = frozenset({2, _NOT_SUPPORTED, 4, 13, 22, 25, 26, None})
_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
_REGISTER = "nvmlDeviceRegisterEvents"  # (the Xid watch's set-up: nvmlEventSetCreate too)
_UNCORRECTED, _VOLATILE = 1, 0  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


class FaultWatch:
    """Hardware-fault reader over the configured GPUs' NVML handles."""

    def __init__(self, nvml: Any, handles: dict[int, Any], log: LogFn) -> None:
        self._nvml, self._handles, self._log = nvml, handles, log
        self._unsupported: set[tuple[str, int]] = set()
        self._failed: set[tuple[str, int]] = set()  # a transient failure was logged
        self._ecc: dict[int, int] = {}  # first reading: only a rise is news
        self._reported: set[tuple[int, str]] = set()  # standing conditions, reported once
        self._events: dict[int, Any] = {}
        for index, handle in handles.items():
            self._register(index, handle)

    def _register(self, index: int, handle: Any) -> None:
        """An event set per GPU for its Xid events. None where the driver never gives one
        (NOT_SUPPORTED: vGPU, some MIG and consumer parts); after any other error (UNKNOWN, a
        driver busy at start-up) asked again at the next poll, once per poll: one bad answer
        at start would otherwise hide every later Xid for good."""
        if (_REGISTER, index) in self._unsupported:
            return
        event_set = None
        try:
            event_set = self._nvml.nvmlEventSetCreate()
            self._nvml.nvmlDeviceRegisterEvents(handle, _XID_CRITICAL, event_set)
        except Exception as exc:  # a fault reader must never stop the daemon
            if event_set is not None:  # a set per failed try would leak at every poll
                with contextlib.suppress(Exception):
                    self._nvml.nvmlEventSetFree(event_set)
            self._failure(_REGISTER, index, exc, quiet=False)  # (a lost GPU: _standing's)
            return
        self._events[index] = event_set

    def poll(self) -> tuple[GpuFault, ...]:
        """Faults new since the last poll, on every configured GPU."""
        found: list[GpuFault] = []
        for index, handle in self._handles.items():
            if index not in self._events:
                self._register(index, handle)  # its start-up error was transient
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
            return self._failure(fn, index, exc, quiet)
        return result

    def _failure(self, fn: str, index: int, exc: Exception, quiet: bool) -> GpuFault | None:
        """What an NVML error means: a GpuFault for a lost GPU, else None; a code that means
        never turns the call off, any other is asked again and said once."""
        code = _code(exc)
        if code == _GPU_IS_LOST:
            return GpuFault(index, "gpu_lost", str(exc))
        if code == _RESET_REQUIRED:
            return GpuFault(index, "reset_required", str(exc))
        if code == _TIMEOUT:  # (the event wait's "nothing pending")
            return None
        if code in _NEVER:
            self._unsupported.add((fn, index))
        elif (fn, index) in self._failed:
            return None  # asked again each poll; said once
        else:
            self._failed.add((fn, index))
        if not quiet and code != _NOT_SUPPORTED:
            self._log("info", "gpu.fault_check_failed", call=fn, gpu=index,
                      error=str(exc), retried=code not in _NEVER)
        return None


# ---- NVML's sight of the tree (was shell/gpusight.py) ----

# Device use above its figure before the launch that makes an unlisted tree "not seen" rather
# than "holding nothing": above one process's CUDA context (~500 MiB) and NVML's drift at
# idle, far below any model's weights. A tree with nothing on the GPU stays at nvml-process.
BLIND_ABOVE_MIB = 1024.0

WHY = ("NVML lists no process of vLLM's tree while the GPU holds {above:.0f} MiB more than "
       "before its launch: vllmwatch runs in another PID namespace than the driver's (a "
       "container without the host's, e.g. a Kubernetes pod without hostPID)")
EFFECT = ("the GPU rules read the whole device's use (source nvml-device), other processes "
          "on these GPUs included")
HINT = ("run the container with the host's PID namespace (Kubernetes `hostPID: true`, "
        "Docker `--pid=host`) or dedicate the GPUs to vLLM; see docs/operations/memory.md")

# The spare's tree alive while NVML is blind: its memory (a build: the whole model, until the
# build fails for want of NVML's figures, docs/operations/spare.md) is in the device's figure
# and cannot be told apart, so the GPU rules wait for it to end rather than fire on it.
PAUSED = ("NVML cannot see vLLM's pids and the spare's tree shares the GPU: its memory "
          "cannot be taken out of the device's figure; the GPU rules wait until it is gone")
# The same where NVML sees our pids but not the tree's figure (a tree process listed without
# one, or the list failed): the device's figure would stand in, with the spare's in it.
PAUSED_UNKNOWN = ("NVML gives no figure for vLLM's tree and the spare's tree shares the GPU: "
                  "its memory cannot be taken out of the device's figure; the GPU rules "
                  "wait until the tree's figure is back or the spare is gone")


def tree_by_gpu(procs: list[GpuProcess] | None, pids: set[int]) -> dict[int, float] | None:
    """Tree memory per GPU; None when NVML lists a tree process without a figure."""
    if procs is None:
        return None
    by_gpu: dict[int, float] = {}
    for p in procs:
        if p.pid not in pids:
            continue
        if p.used_mib is None:
            return None
        by_gpu[p.gpu_index] = by_gpu.get(p.gpu_index, 0.0) + p.used_mib
    return by_gpu


class Sight:
    """NVML's view of the tree: `blind` once the tree is alive, unlisted and the device holds
    memory it did not hold before the launch. Sticky: it holds across samples and children
    (a PID namespace does not come and go), and ends only when NVML lists a pid of the tree,
    so the source never flaps between samples."""

    def __init__(self) -> None:
        self.blind = False
        self._why: dict[str, Any] | None = None  # said once, with the first source change

    def judge(self, procs: list[GpuProcess] | None, pids: tuple[int, ...],
              used: Mapping[int, float], before: Mapping[int, float] | None) -> bool:
        """Update and return `blind` from one sample's reads (`before`: the device's use
        before the tree's launch, None or {} when unknown: nothing is decided then)."""
        if procs is None or not pids:
            return self.blind  # no list or no tree: nothing to learn
        listed = {p.pid for p in procs}
        if listed & set(pids):
            self.blind = False  # NVML sees the tree: its per-process figure is right
            return False
        if self.blind or not before:
            return self.blind
        above = sum(used[g] - before[g] for g in set(used) & set(before))
        if above > BLIND_ABOVE_MIB and not listed & _descendants():
            # (NVML listing another process of ours, the spare's, sees our namespace: the
            # memory above is that process's, not a blind spot)
            self.blind = True
            if self._why is None:
                self._why = {"why": WHY.format(above=above), "effect": EFFECT, "hint": HINT,
                             "listed_pids": sorted(listed)[:8], "tree_pids": list(pids[:8])}
        return self.blind

    def say(self) -> dict[str, Any]:
        """The fields of the first blind source change (a warning), {} after that."""
        why, self._why = self._why, {}
        return why or {}


def _descendants() -> set[int]:
    """Every process under vllmwatch (the serving tree, the spare, the standby)."""
    try:
        return {k.pid for k in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return set()
