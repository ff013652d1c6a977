"""Memory sampling of the vLLM child tree: NVML per process and per device, psutil on the host.

The leak rules (leak.py) are pure; this module is the I/O behind them. Nothing here raises on
an NVML failure: the figure becomes unknown and the first failure of each kind is logged.
`log` is the house log function, `log(level, "dotted.name", **fields)` (vllmwatch/logfn.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol, TypeVar

import psutil

from vllmwatch.core import restart
from vllmwatch.core.samples import GpuProcess, MemorySample
from vllmwatch.logfn import LogFn
from vllmwatch.shell.gpufaults import PAUSED, PAUSED_UNKNOWN, FaultWatch, Sight, tree_by_gpu
from vllmwatch.shell.kin import tree_pids as tree_pids  # (its old home: callers name it here)

_MIB = 1024.0 * 1024.0
# How long the loop's thread (SIGTERM and every deadline wait on it) waits for one NVML read:
# NVML answers in under a millisecond (FACTS.md); a wedged driver can hold a call for good.
LOOP_READ_S = 3.0
_T = TypeVar("_T")


class MemorySampler(Protocol):
    """What the loop needs from a sampler; the real one and fakes implement it."""

    def sample(self, root_pid: int | None, with_pss: bool, faults: bool = True,
               before_launch: Mapping[int, float] | None = None,
               spare: Collection[int] = ()) -> MemorySample:
        """Read the tree rooted at root_pid (None: no child) on the configured GPUs; with
        `faults`, take the GPU faults NVML reports once (only the core's own samples may:
        a fault read anywhere else is lost to it). `before_launch`: the device's use before
        the tree's launch, `spare`: the spare's live pids (shell/gpufaults.py: is NVML's
        process list blind to the tree, and whose memory would the device's figure hold?)."""
        ...

    def gpu_processes(self) -> list[GpuProcess] | None:
        """All compute and graphics processes on the configured GPUs; None when unknown."""
        ...

    def device_used_mib(self) -> dict[int, float]:
        """Used memory per configured GPU; empty where NVML cannot say."""
        ...


class LoopReads:
    """The NVML reads of the loop's thread (the device's use before a launch, the standby's
    GPU check, the spare's figures), each on a daemon thread, waited for LOOP_READ_S at most.

    Past it the answer is "unknown" ({}, None, a sample without GPU figures), as when NVML
    fails; while that read is stuck the next answers unknown at once (one stuck thread, not
    one per call). The core's samples run on workers: a stuck one turns its probe stale.
    """

    def __init__(self, sampler: Callable[[], MemorySampler], log: LogFn,
                 wait: float = LOOP_READ_S) -> None:
        self._sampler, self._log, self._wait = sampler, log, wait
        self._lock = threading.Lock()
        self._stuck: threading.Thread | None = None  # the read that has not answered yet

    def sample(self, root_pid: int | None, with_pss: bool, faults: bool = True,
               before_launch: Mapping[int, float] | None = None,
               spare: Collection[int] = ()) -> MemorySample:
        """MemorySampler.sample with a deadline; unknown: no GPU figure, no fault."""
        return self.within("sample", lambda: self._sampler().sample(
            root_pid, with_pss, faults, before_launch, spare),
            lambda: MemorySample("none", (), None))

    def gpu_processes(self) -> list[GpuProcess] | None:
        """MemorySampler.gpu_processes with a deadline; unknown: None."""
        return self.within("gpu_processes", lambda: self._sampler().gpu_processes(),
                           lambda: None)

    def device_used_mib(self) -> dict[int, float]:
        """MemorySampler.device_used_mib with a deadline; unknown: {}."""
        return self.within("device_used_mib", lambda: self._sampler().device_used_mib(), dict)

    def within(self, what: str, read: Callable[[], _T], unknown: Callable[[], _T]) -> _T:
        """read()'s answer within the deadline (what it raised, raised here), else unknown()'s."""
        with self._lock:
            if self._stuck is not None and self._stuck.is_alive():
                return unknown()
            if self._stuck is not None:
                self._stuck = None
                self._log("info", "nvml.answering", read=what)
            box: list[Any] = []
            def run() -> None:
                try:
                    box.append((True, read()))
                except BaseException as exc:  # handed to the caller below
                    box.append((False, exc))

            worker = threading.Thread(target=run, name="vllmwatch-nvml", daemon=True)
            worker.start()
            worker.join(self._wait)
            if worker.is_alive():
                self._stuck = worker
                self._log("error", "nvml.stuck", read=what, waited_s=self._wait, effect="GPU "
                          "figures unknown until NVML answers; stops are still honoured",
                          hint="a wedged NVIDIA driver? see nvidia-smi and dmesg (Xid)")
                return unknown()
        ok, got = box[0]
        if not ok:
            raise got
        return got  # type: ignore[no-any-return]


def host_memory(pids: tuple[int, ...], with_pss: bool
                ) -> tuple[float, float | None, float | None]:
    """RSS summed over pids, PSS when asked and readable for every live one (MiB), and the
    user + system CPU seconds of the live ones (None when none is left), in one pass.

    A partial PSS would understate the tree, so one unreadable process makes it None. Exited
    processes drop out of the CPU sum, so it can fall; the core only compares readings taken
    while nothing printed (core/hangs.py).
    """
    rss = 0.0
    pss: float | None = 0.0 if with_pss else None
    cpu: float | None = None
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            times = proc.cpu_times()
            cpu = (cpu or 0.0) + times.user + times.system
            if pss is not None:
                try:
                    full = proc.memory_full_info()
                except psutil.AccessDenied:
                    pss = None  # smaps of another user's process: fall through to RSS
                else:
                    rss += full.rss / _MIB
                    got = getattr(full, "pss", None)  # Linux only
                    pss = None if got is None else pss + got / _MIB
                    continue
            rss += proc.memory_info().rss / _MIB
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # exited between the walk and now, or unreadable: nothing to add
    return rss, pss, cpu


class NvmlSampler:
    """The real sampler: NVML when `nvml` is given, host memory (psutil) always."""

    def __init__(self, nvml: Any | None, handles: dict[int, Any], log: LogFn,
                 unified: bool = False) -> None:
        self._nvml = nvml
        self._handles = handles
        self._log = log
        self._warned: set[str] = set()
        self._source: str | None = None
        self._sight = Sight()
        self._unified = unified  # GPU memory is system memory (DGX Spark)
        self._faults = FaultWatch(nvml, handles, log) if nvml is not None else None

    def sample(self, root_pid: int | None, with_pss: bool, faults: bool = True,
               before_launch: Mapping[int, float] | None = None,
               spare: Collection[int] = ()) -> MemorySample:
        """Read the tree; see MemorySample (and the protocol for the keywords)."""
        pids = tree_pids(root_pid)
        rss, pss, cpu = host_memory(pids, with_pss)
        procs = self._processes() if self._nvml is not None else None
        used, total = self._device_memory()
        # NVML blind to the tree (a PID namespace): its 0 MiB is unknown, not nothing
        blind = self._sight.judge(procs, pids, used, before_launch)
        by_gpu = None if blind else tree_by_gpu(procs, set(pids))
        tree = None if by_gpu is None else sum(by_gpu.values())
        # the device's figure standing in would hold the spare's memory: no GPU figure then
        source = self._choose(tree, used, paused=tree is None and bool(spare))
        seen = self._faults.poll() if self._faults is not None and faults else ()
        return MemorySample(source=source, tree_pids=pids, gpu_tree_mib=tree,
                            gpu_tree_by_gpu_mib=by_gpu or {}, device_used_mib=used,
                            device_total_mib=total, host_rss_mib=rss, host_pss_mib=pss,
                            gpu_faults=seen, tree_cpu_s=cpu)

    def gpu_processes(self) -> list[GpuProcess] | None:
        """All compute and graphics processes on the configured GPUs; None when unknown."""
        return self._processes() if self._nvml is not None else None

    def device_used_mib(self) -> dict[int, float]:
        """Used memory per configured GPU; empty where NVML cannot say."""
        return self._device_memory()[0]

    def describe(self) -> dict[str, Any]:
        """Driver version and GPU names by index, for reports; {} without NVML."""
        if self._nvml is None:
            return {}
        try:
            return {"driver": _text(self._nvml.nvmlSystemGetDriverVersion()),
                    "gpus": {i: _text(self._nvml.nvmlDeviceGetName(h))
                             for i, h in self._handles.items()}}
        except Exception:  # a report can do without these
            return {}

    def _choose(self, tree: float | None, used: dict[int, float], paused: bool) -> str:
        if self._unified:
            source = "unified"
        elif self._nvml is None or paused:
            source = "none"
        elif tree is not None:
            source = "nvml-process"
        elif len(used) == len(self._handles) and used:
            source = "nvml-device"
        else:
            source = "host"
        if source != self._source:
            why = self._sight.say() if self._sight.blind and source == "nvml-device" else {}
            self._log("warning" if why else "info", "memory.source", source=source,
                      previous=self._source, gpus=sorted(self._handles),
                      **({"why": PAUSED if self._sight.blind else PAUSED_UNKNOWN}
                         if paused else why))
            self._source = source
        return source

    def _processes(self) -> list[GpuProcess] | None:
        """Processes on every configured GPU, or None when any GPU's list is unknown."""
        out: dict[tuple[int, int], GpuProcess] = {}
        for index, handle in self._handles.items():
            for fn in ("nvmlDeviceGetComputeRunningProcesses",
                       "nvmlDeviceGetGraphicsRunningProcesses"):
                listed = self._call(fn, index, handle)
                if listed is None:
                    if fn.startswith("nvmlDeviceGetGraphics"):
                        continue  # compute is what vLLM uses; graphics is a bonus
                    return None
                for p in listed:
                    mib = None if p.usedGpuMemory is None else p.usedGpuMemory / _MIB
                    # A process may be in both lists with the same figure: count it once.
                    old = out.get((p.pid, index))
                    if old is None or (mib is not None and (old.used_mib or 0.0) < mib):
                        out[(p.pid, index)] = GpuProcess(int(p.pid), index, mib)
        return list(out.values())

    def _device_memory(self) -> tuple[dict[int, float], dict[int, float]]:
        used: dict[int, float] = {}
        total: dict[int, float] = {}
        if self._nvml is None:
            return used, total
        for index, handle in self._handles.items():
            info = self._call("nvmlDeviceGetMemoryInfo", index, handle)
            if info is not None:
                used[index], total[index] = info.used / _MIB, info.total / _MIB
        return used, total

    def _call(self, fn: str, index: int, handle: Any) -> Any:
        """Call one NVML function; on failure warn once per (function, GPU) and return None."""
        assert self._nvml is not None
        try:
            return getattr(self._nvml, fn)(handle)
        except Exception as exc:  # a sampling failure must never stop the daemon
            key = f"{fn}:{index}"
            if key not in self._warned:
                self._warned.add(key)
                unsupported = isinstance(exc, _not_supported(self._nvml))
                self._log("info" if unsupported else "warning", "memory.nvml_call_failed",
                          call=fn, gpu=index, error=str(exc), not_supported=unsupported)
            return None


def _not_supported(nvml: Any) -> type[BaseException] | tuple[()]:
    cls = getattr(nvml, "NVMLError_NotSupported", None)
    return cls if isinstance(cls, type) else ()


def _load_nvml() -> Any:
    import pynvml  # lazy: the package is optional at run time on CPU hosts

    return pynvml


def _open(nvml: Any, gpus: list[int] | None) -> dict[int, Any]:
    """nvmlInit and map configured indexes (None = all) to handles; raises on failure."""
    nvml.nvmlInit()
    indexes = list(range(nvml.nvmlDeviceGetCount())) if gpus is None else gpus
    return {i: nvml.nvmlDeviceGetHandleByIndex(i) for i in indexes}


def make_sampler(gpus: list[int] | None, log: LogFn, nvml: Any | None = None,
                 unified: bool | None = None) -> NvmlSampler:
    """The real sampler: NVML on the configured GPUs when it works, else host memory only.

    `gpus` is None for all devices, [] for a CPU deployment (NVML is not touched). `nvml`
    replaces the pynvml module (tests pass a FakeNvml). `unified` (the platform decision;
    None: memory info NotSupported on every GPU) makes the GPU rules watch the tree's own
    memory (source "unified").
    """
    if gpus == []:
        return NvmlSampler(None, {}, log, unified=bool(unified))
    try:
        module = nvml if nvml is not None else _load_nvml()
        handles = _open(module, gpus)
    except Exception as exc:  # import, library or driver: all mean "no NVML"
        log("warning", "memory.nvml_unavailable", error=f"{type(exc).__name__}: {exc}",
            gpus=gpus, effect="GPU memory rules are off; host memory rules still apply"
            if not unified else "unified memory: the GPU rules watch the tree's PSS/RSS")
        return NvmlSampler(None, {}, log, unified=bool(unified))
    if not handles:
        log("warning", "memory.nvml_unavailable", error="NVML lists no GPU", gpus=gpus,
            effect="GPU memory rules are off; host memory rules still apply")
        return NvmlSampler(None, {}, log, unified=bool(unified))
    if unified is None:
        unified = _memory_info_unsupported(module, handles)
    return NvmlSampler(module, handles, log, unified=unified)


def _memory_info_unsupported(nvml: Any, handles: dict[int, Any]) -> bool:
    """True when nvmlDeviceGetMemoryInfo answers NotSupported on every GPU (unified memory)."""
    cls = _not_supported(nvml)
    for handle in handles.values():
        try:
            nvml.nvmlDeviceGetMemoryInfo(handle)
            return False
        except Exception as exc:  # classified: only NotSupported means unified
            if not cls or not isinstance(exc, cls):
                return False
    return True


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_pids(sampler: MemorySampler) -> set[int] | None:
    """The pids of every process on the sampled GPUs (None when NVML cannot say)."""
    procs = sampler.gpu_processes()
    return None if procs is None else {p.pid for p in procs}


def release_check(sampler: MemorySampler, old_pids: set[int], before_launch: dict[int, float],
                  tolerance_mib: float) -> tuple[bool, str]:
    """Read the sampler once and apply the pure release decision."""
    return restart.released(old_pids, sampler.gpu_processes(), sampler.device_used_mib(),
                            before_launch, tolerance_mib)
