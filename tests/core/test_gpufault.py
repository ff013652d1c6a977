"""GPU hardware faults, the pure verdict: which faults are fatal, how they read, their
exit code."""

from __future__ import annotations

import pytest

from vllmwatch.core import exitcodes, gpufault
from vllmwatch.core.samples import GpuFault


@pytest.mark.parametrize("fault,fatal", [
    (GpuFault(0, "gpu_lost"), True),
    (GpuFault(0, "reset_required"), True),
    (GpuFault(0, "ecc_uncorrectable"), True),
    (GpuFault(0, "row_remap_failed"), True),
    (GpuFault(0, "pages_pending"), False),  # a reset is due; nothing failed yet
    (GpuFault(0, "xid", xid=79), True),  # fallen off the bus
    (GpuFault(0, "xid", xid=48), True),  # double-bit ECC
    (GpuFault(0, "xid", xid=95), True),
    (GpuFault(0, "xid", xid=63), False),  # a page was retired: a warning
    (GpuFault(0, "xid", xid=13), False),  # the program's fault: vLLM exits, the ladder acts
    (GpuFault(0, "xid", xid=43), False),
    (GpuFault(0, "xid", xid=None), False),
])
def test_is_fatal(fault: GpuFault, fatal: bool) -> None:
    assert gpufault.is_fatal(fault) is fatal
    assert gpufault.fatal([fault]) == ((fault,) if fatal else ())


@pytest.mark.parametrize("fault,text", [
    (GpuFault(1, "xid", xid=79), "GPU 1: Xid 79 (GPU has fallen off the bus)"),
    (GpuFault(0, "xid", xid=999), "GPU 0: Xid 999 (see NVIDIA Xid list)"),
    (GpuFault(2, "gpu_lost", "code 15"), "GPU 2: gpu lost: code 15"),
])
def test_describe(fault: GpuFault, text: str) -> None:
    assert gpufault.describe(fault) == text


def test_exit_code_is_distinct() -> None:
    codes = [v for k, v in vars(exitcodes).items() if k.isupper() and isinstance(v, int)]
    assert codes.count(gpufault.EXIT_GPU_FAULT) == 1
    assert "person" in exitcodes.MEANING[gpufault.EXIT_GPU_FAULT]
