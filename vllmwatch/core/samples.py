"""Memory sample types: what the sampler reads and the leak rules judge. Plain data."""

from __future__ import annotations

from dataclasses import dataclass, field, replace


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
        """The GPU rules' figure from this sample alone (tests, bench); the core uses
        gpu_figure with the child's carried HostFigure."""
        return gpu_figure(self, self.host_rule_mib)

    @property
    def host_rule_mib(self) -> float:
        """The host figure of this sample alone: PSS when it has it, else RSS. Not what the
        rules use between PSS samples (see host_figure)."""
        return self.host_pss_mib if self.host_pss_mib is not None else self.host_rss_mib


def gpu_figure(sample: MemorySample, host_mib: float) -> float | None:
    """The figure the GPU rules watch, chosen by `source`; None turns them off. `host_mib`
    is the host rules' figure (HostFigure.mib), so both rules see one kind of host figure."""
    if sample.source == "nvml-process":
        return sample.gpu_tree_mib
    if sample.source == "nvml-device":
        return sum(sample.device_used_mib.values())
    if sample.source == "unified":
        # Unified memory (DGX Spark): the tree's own memory. CUDA allocations live in
        # system RAM but are the driver's pages, not the process's RSS, so NVML's
        # per-process figure (where the driver reports one) is added to the host figure. The
        # device-wide figure never counts: it would include the page cache and tenants.
        return host_mib + (sample.gpu_tree_mib or 0.0)
    if sample.source == "host":
        return host_mib
    return None


def gpu_kind(sample: MemorySample) -> str | None:
    """How gpu_figure makes this sample's figure; None: it makes none. A leak series keeps one
    kind (core/leak.py): the sampler's fallbacks (no process list -> the device's figure, no
    NVML answer -> the host's; on unified memory a failed per-process read leaves the host
    part alone) give figures that differ by the model's size for the same tree."""
    if sample.source == "unified":
        return "unified" if sample.gpu_tree_mib is not None else "unified-host"
    return None if sample.source == "none" else sample.source


PSS, RSS = "pss", "rss"


@dataclass(frozen=True)
class HostFigure:
    """The host figure the memory rules use for one child run, and where it comes from."""

    kind: str  # PSS | RSS: one kind for the whole series
    mib: float
    at: float  # when it was read: a PSS is carried forward between PSS samples
    fresh: bool  # read by the latest sample (the host rules judge only fresh readings)


def host_figure(prev: HostFigure | None, sample: MemorySample, now: float,
                fixed: bool) -> HostFigure:
    """The host figure after `sample`: PSS, the last one carried forward between PSS samples.

    PSS counts the pages vLLM's processes share once (measured: 264 MiB PSS against 4,091 MiB
    RSS for one tree), but it is read only every memory.pss_interval. Mixing in the RSS of the
    samples between would make every RSS sample look like growth against a PSS baseline (on
    unified memory the GPU rule adds this figure too): a false restart. So RSS stands in only
    while PSS was never readable for this child, and once the rules' series started (`fixed`,
    from READY) the kind no longer changes.
    """
    pss = sample.host_pss_mib
    if pss is not None and (prev is None or prev.kind == PSS or not fixed):
        return HostFigure(PSS, pss, now, fresh=True)
    if prev is not None and prev.kind == PSS:
        return replace(prev, fresh=False)
    return HostFigure(RSS, sample.host_rss_mib, now, fresh=True)
