"""The GPU release gate waits on the old tree's pids from the last sample taken while the
child ran. A sample taken after the API server exited (its root a zombie: the engines fell
out of psutil's children; or reaped: no tree at all) lands after the exit: the shell reaps
the child (loop._collect: poll_child) before it reads any worker's answer, and the exit is
swept at once or after the incident record, while which no sample is kept. So such a sample
never becomes the gate's old tree: the gate waits on the engine still."""

from __future__ import annotations

import pytest

from tests.core.test_core_properties import CoreMachine, _ready
from vllmwatch.core.actions import CheckRelease, SampleMemory, Sweep
from vllmwatch.core.events import ChildExited, MemorySampled, RestartRequested, SweepDone
from vllmwatch.core.samples import MemorySample
from vllmwatch.core.state import State


@pytest.mark.parametrize("how", ["crash", "restart"])
def test_a_sample_of_the_exited_root_never_becomes_the_gates_old_tree(how: str) -> None:
    m = CoreMachine()
    _ready(m)
    c = m.s.child
    assert c is not None and c.pid is not None
    root, engine, gen = c.pid, 9999, c.gen
    m.outstanding = [a for a in m.outstanding if not isinstance(a, SampleMemory)]
    m._step(MemorySampled(MemorySample("nvml-process", (root, engine), 6000.0), gen=gen))
    if how == "restart":  # asked: the drain, the stop, then the exit is swept at once
        m._step(RestartRequested())
        for _ in range(40):  # (the drain's checks answered by the world)
            if m.s.state == State.STOPPING:
                break
            m.time_passes(5.0)
        assert m.s.state == State.STOPPING
    m.alive.discard(root)
    m._step(ChildExited(root, 1 if how == "crash" else 0, None))
    for late in ((root,), ()):  # the zombie root's sample, then the reaped root's
        m._step(MemorySampled(MemorySample("nvml-process", late, 0.0), gen=gen))
    for _ in range(20):
        gates = [a for a in m.history if isinstance(a, CheckRelease)]
        if gates:
            break
        m.outstanding = [a for a in m.outstanding if not isinstance(a, SampleMemory)]
        m.world_is_kind(1)
    assert gates, f"no release gate: {m.s.state} {m.s.restart.phase}"
    assert {root, engine} <= set(gates[0].old_pids)


def test_a_tree_dead_before_its_first_sample_still_opens_the_gate_on_every_pid() -> None:
    # A start that failed: no sample was ever taken (they start at READY), the engine exited
    # on its own while the sweep settled (found, not killed). The gate knows both pids.
    m = CoreMachine()
    for _ in range(20):
        if m.s.state == State.STARTING and m.alive:
            break
        m.world_is_kind(1)
    root = max(m.alive)
    assert m.s.child is not None and m.s.child.probes.memory is None
    m.alive.discard(root)
    m._step(ChildExited(root, 1, None))
    for _ in range(20):
        sweeps = [a for a in m.outstanding if isinstance(a, Sweep)]
        if sweeps:
            break
        m.world_is_kind(1)
    assert sweeps, f"no sweep: {m.s.state} {m.s.restart.phase}"
    m.outstanding.remove(sweeps[0])
    m._step(SweepDone((), (), None, seen=(root + 500,)))
    gates = [a for a in m.history if isinstance(a, CheckRelease)]
    assert gates, f"no release gate: {m.s.state} {m.s.restart.phase}"
    assert {root, root + 500} <= set(gates[0].old_pids)
