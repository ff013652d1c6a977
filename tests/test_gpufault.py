"""GPU hardware faults: the pure verdict, and the NVML reader against the fake NVML."""

from __future__ import annotations

import os

import pytest

from vllmwatch.config.schema import from_dict
from vllmwatch.core import exitcodes, gpufault
from vllmwatch.core.events import MemorySampled
from vllmwatch.core.samples import GpuFault, MemorySample
from vllmwatch.core.state import S
from vllmwatch.shell.memory import make_sampler
from vllmwatch.testing import Driver, LogCapture
from vllmwatch.testing.fake_nvml import (
    FakeGpu,
    FakeNvml,
    NVMLError_GpuIsLost,
    NVMLError_NotSupported,
    NVMLError_ResetRequired,
)


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


BASE = from_dict({"vllm": {"model": "m"}, "prewarm": {"enabled": False}})


def _faulty(d: Driver, *faults: GpuFault) -> None:
    assert d.state.child is not None
    sample = MemorySample("nvml-process", (100,), 1000.0, gpu_faults=faults)
    d.send(MemorySampled(sample, 0, d.state.child.gen))


@pytest.mark.parametrize("fault", [GpuFault(0, "xid", xid=79), GpuFault(1, "gpu_lost"),
                                   GpuFault(0, "ecc_uncorrectable", "1 new")])
def test_a_fatal_fault_stops_vllm_and_exits_for_a_person(fault: GpuFault) -> None:
    d = Driver(BASE)
    assert d.run_until(lambda: d.state.state == S.READY)
    _faulty(d, fault)
    assert d.run_until(lambda: d.exit_code is not None, max_seconds=600)
    assert d.exit_code == gpufault.EXIT_GPU_FAULT
    # an exit, not a restart: one daemon.exiting and no restart.begin
    assert [e["reason"] for e in d.events("daemon.exiting")] == ["gpu_fault"]
    assert d.events("daemon.exiting")[0]["code"] == gpufault.EXIT_GPU_FAULT
    assert not d.events("restart.begin")
    (event,) = d.events("gpu.fault")
    assert event["fatal"] and "a person is needed" in event["action"]
    assert not d.events("crashloop.gave_up")
    assert d.world.spawns == 1 and not d.world.child_alive  # stopped, not restarted


def test_a_warning_fault_keeps_serving() -> None:
    d = Driver(BASE)
    assert d.run_until(lambda: d.state.state == S.READY)
    _faulty(d, GpuFault(0, "pages_pending", "reset due"), GpuFault(0, "xid", xid=13))
    d.run_for(60)
    assert [e["kind"] for e in d.events("gpu.fault")] == ["pages_pending", "xid"]
    assert not any(e["fatal"] for e in d.events("gpu.fault"))
    assert d.state.state == S.READY and d.exit_code is None


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
