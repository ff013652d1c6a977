"""GPU hardware faults: the NVML reader against the fake NVML (Xid events, a lost GPU, ECC)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from vllmwatch.core import gpufault
from vllmwatch.core.samples import GpuFault
from vllmwatch.shell.memory import make_sampler
from vllmwatch.testing.driver import LogCapture
from vllmwatch.testing.fake_nvml import (
    FakeGpu,
    FakeNvml,
    NVMLError,
    NVMLError_GpuIsLost,
    NVMLError_NotSupported,
    NVMLError_ResetRequired,
)

Logs = LogCapture


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


@pytest.mark.parametrize("call", ["nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTotalEccErrors",
                                  "nvmlDeviceGetRemappedRows", "nvmlEventSetWait_v2"])
@pytest.mark.parametrize("error,kind", [(NVMLError_GpuIsLost, "gpu_lost"),
                                        (NVMLError_ResetRequired, "reset_required")])
def test_any_call_can_find_the_gpu_gone(call: str, error: type[Exception], kind: str) -> None:
    nvml = FakeNvml([FakeGpu()])
    sampler = make_sampler(None, Logs(), nvml=nvml)
    assert sampler.sample(os.getpid(), False).gpu_faults == ()
    nvml.fail[call] = error()
    faults = sampler.sample(os.getpid(), False).gpu_faults
    assert [(f.gpu_index, f.kind) for f in faults] == [(0, kind)]
    assert gpufault.fatal(faults)


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
    assert not [e for e, _ in logs.got if e.startswith("gpu.")]
    # NOT_SUPPORTED once: never asked again.
    assert nvml.calls.count("nvmlDeviceGetTotalEccErrors") == 1


def test_no_nvml_no_faults() -> None:
    assert make_sampler([], Logs()).sample(os.getpid(), False).gpu_faults == ()


@pytest.mark.parametrize("call,setup,kind", [
    ("nvmlDeviceGetTotalEccErrors", lambda g: setattr(g, "ecc_uncorrected", 3),
     "ecc_uncorrectable"),
    ("nvmlDeviceGetRemappedRows", lambda g: setattr(g, "remapped_rows", (0, 1, 0, 1)),
     "row_remap_failed"),
    ("nvmlDeviceGetRetiredPagesPendingStatus", lambda g: setattr(g, "pages_pending", 1),
     "pages_pending"),
    ("nvmlDeviceGetMemoryInfo", lambda g: setattr(g, "lost", True), "gpu_lost"),
])
def test_a_transient_nvml_error_does_not_turn_a_fault_check_off(
        call: str, setup: Callable[[FakeGpu], None], kind: str) -> None:
    # NVML_ERROR_UNKNOWN (999) once: the driver was busy, the call is supported. Only the
    # errors that say "never" (NOT_SUPPORTED, NO_PERMISSION, ...) turn a check off; before,
    # any error did, and the ECC error or lost GPU that came later went unseen (a crash
    # loop instead of exit 74). GPU lost: the other checks are off (a part without them).
    nvml = FakeNvml([FakeGpu()])
    if kind == "gpu_lost":
        for fn in ("nvmlDeviceRegisterEvents", "nvmlDeviceGetTotalEccErrors",
                   "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPagesPendingStatus"):
            nvml.fail[fn] = NVMLError_NotSupported()
    logs = Logs()
    sampler = make_sampler(None, logs, nvml=nvml)
    assert sampler.sample(os.getpid(), False).gpu_faults == ()
    nvml.fail[call] = NVMLError()
    for _ in range(3):
        assert sampler.sample(os.getpid(), False).gpu_faults == ()
    said = [f for e, f in logs.got if e == "gpu.fault_check_failed"]
    # said once, not at every sample (memory info: by the sampler, memory.nvml_call_failed)
    assert [f["call"] for f in said] == ([] if call == "nvmlDeviceGetMemoryInfo" else [call])
    del nvml.fail[call]
    assert sampler.sample(os.getpid(), False).gpu_faults == ()  # (the ECC count's base)
    setup(nvml.gpus[0])
    assert [f.kind for f in sampler.sample(os.getpid(), False).gpu_faults] == [kind]


@pytest.mark.parametrize("error", [NVMLError_NotSupported(), AttributeError("no such call")])
def test_a_call_that_can_never_answer_is_asked_once(error: Exception) -> None:
    nvml = FakeNvml([FakeGpu()])
    nvml.fail["nvmlDeviceGetRemappedRows"] = error
    sampler = make_sampler(None, Logs(), nvml=nvml)
    for _ in range(3):
        sampler.sample(os.getpid(), False)
    assert nvml.calls.count("nvmlDeviceGetRemappedRows") == 1


def test_a_transient_error_at_xid_registration_is_tried_again() -> None:
    # NVML_ERROR_UNKNOWN (999) from nvmlDeviceRegisterEvents at start-up: before, the Xid
    # watch was given up for good and a later Xid 79 went unseen; now it is registered at a
    # later poll, said once, and the failed try's event set freed.
    nvml = FakeNvml([FakeGpu(xids=[79])])
    nvml.fail["nvmlDeviceRegisterEvents"] = NVMLError()
    logs = Logs()
    sampler = make_sampler(None, logs, nvml=nvml)
    for _ in range(2):
        assert sampler.sample(os.getpid(), False).gpu_faults == ()
    said = [f for e, f in logs.got if e == "gpu.fault_check_failed"]
    assert [(f["call"], f["retried"]) for f in said] == [("nvmlDeviceRegisterEvents", True)]
    tries = nvml.calls.count("nvmlDeviceRegisterEvents")
    assert tries == 3 and nvml.freed == tries  # start-up and once per poll, none leaked
    del nvml.fail["nvmlDeviceRegisterEvents"]
    assert sampler.sample(os.getpid(), False).gpu_faults == (GpuFault(0, "xid", xid=79),)
    assert nvml.calls.count("nvmlDeviceRegisterEvents") == tries + 1  # registered: done
    sampler.sample(os.getpid(), False)
    assert nvml.calls.count("nvmlDeviceRegisterEvents") == tries + 1


class _NoPermission(NVMLError):
    value = 4  # NVML_ERROR_NO_PERMISSION


@pytest.mark.parametrize("error,said", [(NVMLError_NotSupported(), False),
                                        (_NoPermission(), True)])
def test_xid_registration_that_can_never_work_is_tried_once(error: Exception,
                                                            said: bool) -> None:
    nvml = FakeNvml([FakeGpu(xids=[79])])
    nvml.fail["nvmlDeviceRegisterEvents"] = error
    logs = Logs()
    sampler = make_sampler(None, logs, nvml=nvml)
    for _ in range(3):
        assert sampler.sample(os.getpid(), False).gpu_faults == ()
    assert nvml.calls.count("nvmlDeviceRegisterEvents") == 1
    got = [(f["call"], f["retried"]) for e, f in logs.got if e == "gpu.fault_check_failed"]
    assert got == ([("nvmlDeviceRegisterEvents", False)] if said else [])
