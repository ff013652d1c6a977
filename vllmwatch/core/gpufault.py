"""GPU hardware faults: which ones a restart cannot fix and a person must look at. Pure.

A GPU fallen off the bus (NVML_ERROR_GPU_IS_LOST, Xid 79), one that needs a reset, an
uncorrectable ECC error or a failed row remap does not get better by restarting vLLM: the
next start fails the same way and the crash-loop guard would end in a generic give-up.
vllmwatch names it (`gpu_fault`), stops vLLM and exits EXIT_GPU_FAULT so that systemd (or
Kubernetes) does not restart it into the same wall.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from vllmwatch.core import ladder
from vllmwatch.core.actions import Action, Log
from vllmwatch.core.names import Reason, exit_code
from vllmwatch.core.samples import GpuFault
from vllmwatch.core.state import Result, WatchState

EXIT_GPU_FAULT = exit_code(Reason.GPU_FAULT)

# Xids that mean the hardware (or its firmware), not the program: NVIDIA's Xid catalogue.
# Others (13, 31, 43, 45: a program's fault) end with vLLM exiting, which the ladder handles.
HARDWARE_XIDS = {
    48: "double-bit ECC error",
    61: "internal microcontroller breakpoint",
    62: "internal microcontroller halt",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapper failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
FATAL_KINDS = ("gpu_lost", "reset_required", "ecc_uncorrectable", "row_remap_failed")
NEXT_STEP = ("a person is needed: read `dmesg | grep -i xid` and `nvidia-smi -q`, reset the "
             "GPU (nvidia-smi -r) or drain and reboot the node, then start vllmwatch again")


def is_fatal(fault: GpuFault) -> bool:
    """True when restarting vLLM cannot help: the GPU needs a person."""
    if fault.kind == "xid":
        return fault.xid in HARDWARE_XIDS and fault.xid not in (63, 92)  # 63/92: warnings
    return fault.kind in FATAL_KINDS


def fatal(faults: Iterable[GpuFault]) -> tuple[GpuFault, ...]:
    """The faults that end supervision with EXIT_GPU_FAULT."""
    return tuple(f for f in faults if is_fatal(f))


def describe(fault: GpuFault) -> str:
    """One phrase for logs and the restart detail: 'GPU 1: Xid 79 (GPU has fallen off...)'."""
    if fault.kind == "xid":
        what = f"Xid {fault.xid} ({HARDWARE_XIDS.get(fault.xid or 0, 'see NVIDIA Xid list')})"
    else:
        what = fault.kind.replace("_", " ")
    return f"GPU {fault.gpu_index}: {what}" + (f": {fault.detail}" if fault.detail else "")


def react(s: WatchState, faults: Iterable[GpuFault], now: float) -> tuple[Result, bool]:
    """Log every fault; on a fatal one stop vLLM and leave with EXIT_GPU_FAULT.

    Returns (result, ends): `ends` is True when supervision is over (no leak rules then).
    """
    faults = tuple(faults)
    acts: list[Action] = [Log("warning", "gpu.fault", {
        "gpu": f.gpu_index, "kind": f.kind, "xid": f.xid, "detail": describe(f),
        "fatal": False}) for f in faults if not is_fatal(f)]
    bad = fatal(faults)
    if not bad:
        return (s, acts), False
    detail = "; ".join(describe(f) for f in bad)
    acts.append(Log("critical", "gpu.fault", {
        "gpus": sorted({f.gpu_index for f in bad}), "kinds": sorted({f.kind for f in bad}),
        "detail": detail, "fatal": True, "exit_code": EXIT_GPU_FAULT, "action": NEXT_STEP}))
    if s.exit_code is None:  # a stop already under way keeps its own code and reason
        s = replace(s, last_reason=Reason.GPU_FAULT, last_detail=detail)
    s, more = ladder.halt(s, now, Reason.GPU_FAULT, detail)
    return (s, acts + more), True
