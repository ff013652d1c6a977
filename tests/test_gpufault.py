"""GPU hardware faults: the pure verdict, and the NVML reader against the fake NVML."""

from __future__ import annotations

import os
from typing import Any

import pytest

from vllmwatch.core import gpufault
from vllmwatch.core.samples import GpuFault
from vllmwatch.shell.memory import make_sampler
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml, NVMLError_NotSupported


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
    from vllmwatch.core import ladder

    taken = {ladder.EXIT_FAILURE, ladder.EXIT_CONFIG, ladder.EXIT_GAVE_UP, ladder.EXIT_START}
    assert gpufault.EXIT_GPU_FAULT not in taken | {0}


class Logs:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))


def _sample(nvml: FakeNvml, log: Logs | None = None) -> tuple[GpuFault, ...]:
    return make_sampler(None, log or Logs(), nvml=nvml).sample(os.getpid(), False).gpu_faults


def test_xid_events_are_read_once() -> None:
    nvml = FakeNvml([FakeGpu(), FakeGpu(xids=[13, 79])])
    sampler = make_sampler(None, Logs(), nvml=nvml)
    first = sampler.sample(os.getpid(), False).gpu_faults
    assert first == (GpuFault(1, "xid", xid=13), GpuFault(1, "xid", xid=79))
    assert sampler.sample(os.getpid(), False).gpu_faults == ()


def test_a_lost_gpu_is_reported_once() -> None:
    nvml = FakeNvml([FakeGpu(), FakeGpu()])
    sampler = make_sampler(None, Logs(), nvml=nvml)
    assert sampler.sample(os.getpid(), False).gpu_faults == ()
    nvml.gpus[0].lost = True
    faults = sampler.sample(os.getpid(), False).gpu_faults
    assert [(f.gpu_index, f.kind) for f in faults] == [(0, "gpu_lost")]
    assert gpufault.fatal(faults)
    assert sampler.sample(os.getpid(), False).gpu_faults == ()


def test_ecc_counts_only_a_rise_and_pending_pages() -> None:
    nvml = FakeNvml([FakeGpu(ecc_uncorrected=4)])  # old errors from before we started
    sampler = make_sampler(None, Logs(), nvml=nvml)
    assert sampler.sample(os.getpid(), False).gpu_faults == ()
    nvml.gpus[0].ecc_uncorrected = 6
    nvml.gpus[0].pages_pending = 1
    faults = sampler.sample(os.getpid(), False).gpu_faults
    assert [f.kind for f in faults] == ["ecc_uncorrectable", "pages_pending"]
    assert "2 new" in faults[0].detail
    nvml.gpus[0].remapped_rows = (0, 1, 0, 1)
    assert [f.kind for f in sampler.sample(os.getpid(), False).gpu_faults] == [
        "row_remap_failed"]


def test_a_driver_without_these_calls_is_quiet() -> None:
    nvml = FakeNvml([FakeGpu(xids=[79])])
    for fn in ("nvmlDeviceRegisterEvents", "nvmlDeviceGetTotalEccErrors",
               "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPagesPendingStatus"):
        nvml.fail[fn] = NVMLError_NotSupported()
    logs = Logs()
    sampler = make_sampler(None, logs, nvml=nvml)
    assert sampler.sample(os.getpid(), False).gpu_faults == ()
    sampler.sample(os.getpid(), False)
    assert not [e for e, _ in logs.events if e.startswith("gpu.")]
    # NOT_SUPPORTED once: never asked again.
    assert nvml.calls.count("nvmlDeviceGetTotalEccErrors") == 1


def test_no_nvml_no_faults() -> None:
    assert make_sampler([], Logs()).sample(os.getpid(), False).gpu_faults == ()
