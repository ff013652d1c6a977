"""A fatal GPU fault is the machine's, not one run's: a memory sample that carries it is
acted on however late it lands (after its child died, while that crash is recorded); the
fault watch says a standing fault once, so a dropped sample meant a relaunch on a lost GPU,
a crash loop and exit 75 (restarted by systemd) instead of exit 74 (hostile review)."""

from __future__ import annotations

import pytest

from tests.core.test_core_properties import CoreMachine, _ready
from vllmwatch.core.actions import Log, SampleMemory, Spawn
from vllmwatch.core.events import ChildExited, MemorySampled, Tick
from vllmwatch.core.gpufault import EXIT_GPU_FAULT
from vllmwatch.core.samples import GpuFault, MemorySample


def _sample_out(m: CoreMachine) -> SampleMemory:
    for _ in range(60):
        out = [a for a in m.outstanding if isinstance(a, SampleMemory)]
        if out:
            m.outstanding.remove(out[0])
            return out[0]
        m.now += 1.0
        m._step(Tick())
    raise AssertionError("no memory sample went out")


@pytest.mark.parametrize("fault", [GpuFault(0, "gpu_lost"), GpuFault(0, "xid", xid=48)])
def test_a_fatal_fault_in_a_sample_that_lands_after_its_child_died_ends_with_74(
        fault: GpuFault) -> None:
    m = CoreMachine()
    _ready(m)
    sample = _sample_out(m)
    pid = max(m.alive)
    m.alive.discard(pid)
    m._step(ChildExited(pid, None, "SIGKILL"))  # the engine died with the GPU
    launches = sum(isinstance(a, Spawn) for a in m.history)
    mark = len(m.history)
    m._step(MemorySampled(MemorySample("nvml-process", (pid,), 100.0, host_rss_mib=1.0,
                                       gpu_faults=(fault,)), 0, sample.gen))
    said = [a for a in m.history[mark:] if isinstance(a, Log) and a.event == "gpu.fault"]
    assert said and said[-1].fields["fatal"] is True, said
    m.world_is_kind(6)
    assert m.s.exit_code == EXIT_GPU_FAULT
    assert sum(isinstance(a, Spawn) for a in m.history) == launches  # never relaunched


def test_a_non_fatal_fault_in_a_late_sample_is_still_said_and_changes_nothing() -> None:
    m = CoreMachine()
    _ready(m)
    sample = _sample_out(m)
    pid = max(m.alive)
    m.alive.discard(pid)
    m._step(ChildExited(pid, None, "SIGKILL"))
    mark = len(m.history)
    m._step(MemorySampled(MemorySample("nvml-process", (pid,), 100.0, host_rss_mib=1.0,
                                       gpu_faults=(GpuFault(0, "xid", xid=13),)), 0, sample.gen))
    said = [a for a in m.history[mark:] if isinstance(a, Log) and a.event == "gpu.fault"]
    assert [a.fields["fatal"] for a in said] == [False]
    m.world_is_kind(6)
    assert m.s.exit_code is None  # the crash's restart goes on
