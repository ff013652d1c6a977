"""The spare's own reads of NVML never take the GPU faults from the core (sparefx.free_mib,
the plan at start). NVML reports a fault once (an Xid event is taken off its queue; a lost
GPU is reported once): the wake's room check runs right after an engine died, so an Xid 79
read there was lost to the core, which failed over and restarted on a dead GPU until the
crash-loop guard instead of halting with exit 74."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.models import spare_config
from vllmwatch.shell import sparefx
from vllmwatch.shell.memory import make_sampler
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml
from vllmwatch.testing.world import LogCapture


def _fault(gpu: FakeGpu, kind: str) -> None:
    if kind == "xid":
        gpu.xids.append(79)  # fallen off the bus
    else:
        gpu.lost = True


@pytest.mark.parametrize("kind", ["xid", "lost"])
@pytest.mark.parametrize("when", ["wake", "plan"])
def test_the_core_still_sees_a_fault_the_spare_read_past(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, when: str) -> None:
    state = str(tmp_path / "state")
    monkeypatch.setenv("STATE_DIRECTORY", state)
    nvml = FakeNvml([FakeGpu(total_mib=143771.0)])
    sampler = make_sampler([0], LogCapture(), nvml=nvml)
    if when == "plan":  # a fault already there at the start (a lost GPU: no plan, no spare)
        _fault(nvml.gpus[0], kind)
    fx = sparefx.make(spare_config(tmp_path), {"STATE_DIRECTORY": state}, sampler, False,
                      LogCapture())
    if when == "wake":
        assert fx is not None
        _fault(nvml.gpus[0], kind)
        fx.tree._free()  # the wake's room check, what SpareTree.wake asks first
    seen = sampler.sample(os.getpid(), False).gpu_faults  # the core's next memory sample
    assert seen, f"the {kind} fault was taken by the spare's {when} read"
