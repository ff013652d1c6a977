"""Memory sample types: what the sampler reads and the leak rules judge. Plain data."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuProcess:
    """One process NVML lists on a configured GPU; used_mib None when NVML does not know it."""

    pid: int
    gpu_index: int
    used_mib: float | None


@dataclass(frozen=True)
class GpuFault:
    """A hardware fault NVML reports on a configured GPU (core/gpufault.py judges it).

    kind: gpu_lost | reset_required | xid | ecc_uncorrectable | row_remap_failed |
    pages_pending (a reset is due, nothing has failed yet).
    """

    gpu_index: int
    kind: str
    detail: str = ""
    xid: int | None = None


@dataclass(frozen=True)
class MemorySample:
    """One reading of the child tree. `source` names the figure the GPU rules use."""

    source: str  # nvml-process | nvml-device | unified | host | none
    tree_pids: tuple[int, ...]
    gpu_tree_mib: float | None
    gpu_tree_by_gpu_mib: dict[int, float] = field(default_factory=dict)
    device_used_mib: dict[int, float] = field(default_factory=dict)
    device_total_mib: dict[int, float] = field(default_factory=dict)
    host_rss_mib: float = 0.0
    host_pss_mib: float | None = None
    gpu_faults: tuple[GpuFault, ...] = ()  # new since the previous sample
    tree_cpu_s: float | None = None  # user+system CPU of the tree's live processes, s

    @property
    def gpu_rule_mib(self) -> float | None:
        """The figure the GPU rules watch, chosen by `source`; None turns them off."""
        if self.source == "nvml-process":
            return self.gpu_tree_mib
        if self.source == "nvml-device":
            return sum(self.device_used_mib.values())
        if self.source == "unified":
            # Unified memory (DGX Spark): the tree's own memory. CUDA allocations live in
            # system RAM but are the driver's pages, not the process's RSS, so NVML's
            # per-process figure (where the driver reports one) is added to PSS/RSS. The
            # device-wide figure never counts: it would include the page cache and tenants.
            return self.host_rule_mib + (self.gpu_tree_mib or 0.0)
        if self.source == "host":
            return self.host_rule_mib
        return None

    @property
    def host_rule_mib(self) -> float:
        """The host figure of this sample alone: PSS when it has it, else RSS."""
        value, _ = host_figure(self, pss_seen=False)
        assert value is not None
        return value


def host_figure(sample: MemorySample, pss_seen: bool) -> tuple[float | None, bool]:
    """The figure the host rules watch, and whether PSS has now been seen.

    PSS (shared pages counted once) is the right figure but sampled slowly; RSS stands in only
    while PSS was never readable for this child, so one series never mixes the two.
    """
    if sample.host_pss_mib is not None:
        return sample.host_pss_mib, True
    return (None if pss_seen else sample.host_rss_mib), pss_seen
