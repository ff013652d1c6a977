"""`vllmwatch check` on the platform: unified (DGX Spark) or discrete GPU memory, and on
unified memory what vLLM's start-up check will demand against what it will see."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllmwatch.check.base import PASS, WARN, CheckResult, Context, vllm_flags
from vllmwatch.core.unified import GuardSettings, MemInfo, Platform, decide_platform, floor_for
from vllmwatch.prewarm import evict, pagecache
from vllmwatch.prewarm.runner import model_dir
from vllmwatch.shell import platform as plat

_GIB = 1024.0
VLLM_DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default (0.26, 0.32)


def platform_of(ctx: Context) -> tuple[Platform, str | None]:
    """The platform decision for this config, and NVML's error when it was not reachable."""
    c = ctx.config
    if c.memory.unified != "auto" or not c.vllm.uses_gpu:
        return decide_platform(c.memory.unified, (), ()), None
    try:
        module = ctx.nvml() if ctx.nvml is not None else plat._load_nvml()
        if module is None:
            return decide_platform("auto", (), ()), "nvidia-ml-py is not installed"
        names, answers = plat.nvml_answers(module, c.vllm.gpus)
    except Exception as exc:  # no driver: discrete unless the config says otherwise
        return decide_platform("auto", (), ()), f"{type(exc).__name__}: {exc}"
    return decide_platform("auto", names, answers), None


def check_platform(ctx: Context, meminfo: Callable[[], MemInfo | None] = plat.read_meminfo,
                   resident: Callable[[Context], tuple[float, float] | None] | None = None
                   ) -> list[CheckResult]:
    """One line naming the platform; on unified memory the memory picture and the advice.

    Nothing for a CPU config (vllm.gpus = []) unless memory.unified = true says otherwise.
    """
    if not ctx.config.vllm.uses_gpu and ctx.config.memory.unified != "true":
        return []
    p, error = platform_of(ctx)
    why = f"{p.reason}{': ' + p.device if p.device else ''}"
    if not p.unified:
        tail = f"; NVML: {error}; on a DGX Spark set memory.unified = true" if error else ""
        return [CheckResult("platform", PASS, f"discrete GPU memory ({why}); page-cache "
                            f"prewarm as configured, start guard off{tail}")]
    m = ctx.config.memory
    out = [CheckResult("platform", PASS, f"unified memory ({why}); prewarm evicts the model "
                       "from the page cache; start guard "
                       + ("on" if m.guard else "off (memory.guard = false)"))]
    info = meminfo()
    if info is None:
        return [*out, CheckResult("unified.memory", WARN, "cannot read /proc/meminfo")]
    res = (resident or _model_resident)(ctx)
    return [*out, _memory_line(ctx, info, res), _startup_line(ctx, info, res), _kv_line(ctx)]


def _model_resident(ctx: Context) -> tuple[float, float] | None:
    """(resident, total) MiB of the model's weight files in the page cache."""
    where = model_dir(ctx.config, ctx.env)
    files = pagecache.weight_files(where) if where else []
    got = evict.resident_bytes(files) if files else None
    if got is None:
        return None
    return got / 2**20, sum(f.stat().st_size for f in files) / 2**20


def _memory_line(ctx: Context, info: MemInfo, res: tuple[float, float] | None) -> CheckResult:
    floor = floor_for(GuardSettings(floor_mib=ctx.config.memory.guard_floor), info.total_mib)
    model = "model residency unknown (no local weight files)" if res is None else (
        f"model {res[0] / _GIB:.1f} of {res[1] / _GIB:.1f} GiB in the page cache")
    status = WARN if info.free_mib < floor else PASS
    return CheckResult("unified.memory", status, f"MemFree {info.free_mib / _GIB:.1f} GiB, "
                       f"MemAvailable {info.available_mib / _GIB:.1f} GiB, page cache "
                       f"{info.cached_mib / _GIB:.1f} GiB of {info.total_mib / _GIB:.1f} GiB; "
                       f"{model}; guard floor {floor / _GIB:.1f} GiB")


def _utilization(flags: dict[str, Any]) -> float | None:
    value = flags.get("gpu-memory-utilization", VLLM_DEFAULT_UTILIZATION)
    if isinstance(value, bool):  # the flag without a value: vLLM would refuse it
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _startup_line(ctx: Context, info: MemInfo, res: tuple[float, float] | None
                  ) -> CheckResult:
    """vLLM's check wants utilization x total free; on unified memory it sees MemFree.

    The check runs with kv-cache-memory-bytes set too (vLLM 0.26/0.32 gpu_worker.py
    init_device -> request_memory), so the utilization still gates the start.
    """
    flags = vllm_flags(ctx)
    util = _utilization(flags)
    if util is None:
        return CheckResult("unified.startup-check", WARN, "gpu-memory-utilization is not a "
                           "number; vLLM will refuse it")
    want = util * info.total_mib
    after = info.free_mib + (res[0] if res else 0.0)
    # vLLM 0.26/0.32 utils/mem_utils.py MemorySnapshot.measure() reads MemAvailable instead
    # when torch says the GPU is integrated; cudaMemGetInfo (MemFree) otherwise.
    text = (f"vLLM will want {want / _GIB:.1f} GiB free (gpu-memory-utilization {util:g} x "
            f"{info.total_mib / _GIB:.1f} GiB) and see MemFree {info.free_mib / _GIB:.1f} GiB "
            f"now, about {after / _GIB:.1f} GiB after vllmwatch evicts the model "
            f"(MemAvailable {info.available_mib / _GIB:.1f} GiB where torch reports the GPU "
            "as integrated)")
    if after >= want:
        return CheckResult("unified.startup-check", PASS, text)
    return CheckResult("unified.startup-check", WARN, text + "; it will refuse to start unless "
                       "other memory is freed: lower gpu-memory-utilization, set "
                       "kv-cache-memory-bytes, or stop other tenants")


def _kv_line(ctx: Context) -> CheckResult:
    flags = vllm_flags(ctx)
    if "kv-cache-memory-bytes" in flags:
        return CheckResult("unified.kv-cache", PASS, "kv-cache-memory-bytes = "
                           f"{flags['kv-cache-memory-bytes']}: starts are repeatable")
    set_ = "gpu-memory-utilization is set" if "gpu-memory-utilization" in flags else \
        f"gpu-memory-utilization defaults to {VLLM_DEFAULT_UTILIZATION}"
    return CheckResult("unified.kv-cache", WARN, f"{set_} without kv-cache-memory-bytes: on "
                       "unified memory the KV cache size then moves with page-cache activity; "
                       "set vllm.args.kv-cache-memory-bytes (e.g. \"40G\") for repeatable "
                       "starts")
