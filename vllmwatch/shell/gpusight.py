"""Whether NVML's process list can see vLLM's tree, and the tree's share of it.

NVML names processes by the pid the driver sees: the host's. In a container without the
host's PID namespace (Kubernetes without `hostPID`, Docker without `--pid=host`) it lists
vLLM's processes under pids that are not ours, or lists none at all (what nvidia-smi shows
there). The tree's per-process sum is then 0 MiB while the device fills up: a figure the GPU
rules would watch forever without firing. `Sight` tells that case apart from a start where
the tree genuinely holds nothing yet, and the sampler falls back to the device's figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psutil

from vllmwatch.core.samples import GpuProcess

# Device use above its figure before the launch that makes an unlisted tree "not seen" rather
# than "holding nothing": above one process's CUDA context (~500 MiB) and NVML's drift at
# idle, far below any model's weights. A tree with nothing on the GPU stays at nvml-process.
BLIND_ABOVE_MIB = 1024.0

WHY = ("NVML lists no process of vLLM's tree while the GPU holds {above:.0f} MiB more than "
       "before its launch: vllmwatch runs in another PID namespace than the driver's (a "
       "container without the host's, e.g. a Kubernetes pod without hostPID)")
EFFECT = ("the GPU rules read the whole device's use (source nvml-device), other processes "
          "on these GPUs included")
HINT = ("run the container with the host's PID namespace (Kubernetes `hostPID: true`, "
        "Docker `--pid=host`) or dedicate the GPUs to vLLM; see docs/operations/memory.md")

# The spare's tree alive while NVML is blind: its memory (a build: the whole model, until the
# build fails for want of NVML's figures, docs/operations/spare.md) is in the device's figure
# and cannot be told apart, so the GPU rules wait for it to end rather than fire on it.
PAUSED = ("NVML cannot see vLLM's pids and the spare's tree shares the GPU: its memory "
          "cannot be taken out of the device's figure; the GPU rules wait until it is gone")


def tree_by_gpu(procs: list[GpuProcess] | None, pids: set[int]) -> dict[int, float] | None:
    """Tree memory per GPU; None when NVML lists a tree process without a figure."""
    if procs is None:
        return None
    by_gpu: dict[int, float] = {}
    for p in procs:
        if p.pid not in pids:
            continue
        if p.used_mib is None:
            return None
        by_gpu[p.gpu_index] = by_gpu.get(p.gpu_index, 0.0) + p.used_mib
    return by_gpu


class Sight:
    """NVML's view of the tree: `blind` once the tree is alive, unlisted and the device holds
    memory it did not hold before the launch. Sticky: it holds across samples and children
    (a PID namespace does not come and go), and ends only when NVML lists a pid of the tree,
    so the source never flaps between samples."""

    def __init__(self) -> None:
        self.blind = False
        self._why: dict[str, Any] | None = None  # said once, with the first source change

    def judge(self, procs: list[GpuProcess] | None, pids: tuple[int, ...],
              used: Mapping[int, float], before: Mapping[int, float] | None) -> bool:
        """Update and return `blind` from one sample's reads (`before`: the device's use
        before the tree's launch, None or {} when unknown: nothing is decided then)."""
        if procs is None or not pids:
            return self.blind  # no list or no tree: nothing to learn
        listed = {p.pid for p in procs}
        if listed & set(pids):
            self.blind = False  # NVML sees the tree: its per-process figure is right
            return False
        if self.blind or not before:
            return self.blind
        above = sum(used[g] - before[g] for g in set(used) & set(before))
        if above > BLIND_ABOVE_MIB and not listed & _descendants():
            # (NVML listing another process of ours, the spare's, sees our namespace: the
            # memory above is that process's, not a blind spot)
            self.blind = True
            if self._why is None:
                self._why = {"why": WHY.format(above=above), "effect": EFFECT, "hint": HINT,
                             "listed_pids": sorted(listed)[:8], "tree_pids": list(pids[:8])}
        return self.blind

    def say(self) -> dict[str, Any]:
        """The fields of the first blind source change (a warning), {} after that."""
        why, self._why = self._why, {}
        return why or {}


def _descendants() -> set[int]:
    """Every process under vllmwatch (the serving tree, the spare, the standby)."""
    try:
        return {k.pid for k in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return set()
