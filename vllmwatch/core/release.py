"""The GPU release gate: before a new child starts, the old tree's GPU memory must be free.

Otherwise the new vLLM sizes its KV cache against memory the old one still holds, and fails
or starts small. `released` is pure; the shell reads a sampler and applies it. The loop polls it
until it says yes or `restart.gpu_release_timeout` passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vllmwatch.core.samples import GpuProcess


@dataclass(frozen=True)
class ReleaseGate:
    """The gate while it waits (beside core/drain.Drain, the other bounded wait of a restart):
    the old tree's pids, when it gives up, and when it looks next (None: a look is out)."""

    old_pids: tuple[int, ...]
    deadline: float  # restart.gpu_release_timeout after the sweep
    look_at: float | None = None


def due(gate: ReleaseGate | None, now: float) -> bool:
    """Whether the gate should look at the GPUs now (one look in flight at a time)."""
    return gate is not None and gate.look_at is not None and now >= gate.look_at


def released(old_pids: set[int], procs: list[GpuProcess] | None,
             device_used: Mapping[int, float], before_launch: Mapping[int, float],
             tolerance_mib: float) -> tuple[bool, str]:
    """True when NVML lists no process of the old tree and every GPU measured both before the
    launch and now is within tolerance of its pre-launch use; the text says why.

    procs None (process list unknown) decides on device memory alone; device memory unknown
    decides on processes alone; both unknown cannot hold a restart back.
    """
    waiting: list[str] = []
    if procs is not None:
        left = sorted((p.pid, p.gpu_index) for p in procs if p.pid in old_pids)
        if left:
            waiting.append("old processes still on the GPU: " + ", ".join(
                f"pid {pid} on GPU {gpu}" for pid, gpu in left))
    compared = sorted(set(device_used) & set(before_launch))
    for gpu in compared:
        now, before = device_used[gpu], before_launch[gpu]
        if now > before + tolerance_mib:
            waiting.append(f"GPU {gpu} uses {now:.0f} MiB, {now - before:.0f} MiB above its "
                           f"{before:.0f} MiB before launch (tolerance {tolerance_mib:g} MiB)")
    if waiting:
        return False, "; ".join(waiting)
    if procs is None and not compared:
        return True, "cannot verify: NVML gives neither processes nor device memory"
    basis = [] if procs is None else ["no old process on the GPU"]
    if compared:
        basis.append(f"device memory back within {tolerance_mib:g} MiB on GPU " +
                     ", ".join(str(g) for g in compared))
    return True, "; ".join(basis)

