"""GPU hardware faults through the real loop (Driver): a fatal one stops vLLM and exits for
a person, a warning keeps serving."""

from __future__ import annotations

import pytest

from vllmwatch.config.schema import from_dict
from vllmwatch.core import gpufault
from vllmwatch.core.events import MemorySampled
from vllmwatch.core.samples import GpuFault, MemorySample
from vllmwatch.core.state import S
from vllmwatch.testing.driver import Driver

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
