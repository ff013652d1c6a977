"""`vllmwatch check` on the spare engine ([spare], issue 34): its plan (GPU footprint awake and
asleep, the serving engine's reduced setting, host memory needed against available) or why
it is off and what to change. The plan itself is pure (config/spare.py); here are the facts
it needs, read from this machine: NVML, /proc/meminfo, the installed vLLM's flags, the
model's config.json and weight files. Estimates until the spare has run (the daemon plans
again with its measured footprint)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from vllmwatch.check.base import FAIL, PASS, WARN, CheckResult, Context
from vllmwatch.check.gpu import load_nvml
from vllmwatch.check.host import serving_now
from vllmwatch.check.unified import platform_of
from vllmwatch.config import spare, vllmflags, vllminfo
from vllmwatch.shell import platform as plat
from vllmwatch.shell import sparefx
from vllmwatch.shell.child import instance_id
from vllmwatch.shell.sparefx import flags_of, model_figures

NAME = "spare"
_MIB = 2**20


def check_spare(ctx: Context, meminfo: Callable[[], Any] = plat.read_meminfo,
                serving: Callable[[Context], bool] | None = None) -> list[CheckResult]:
    """One row with the decision and the spare's footprint; with a spare, one row each for
    the serving engine's setting and the host memory. FAIL where spare.enabled = true cannot
    be honoured; WARN where a figure needed is unknown; auto's "off" is a PASS (by design),
    but for want of a place for its socket a WARN, as the daemon's spare.plan is."""
    c = ctx.config
    instance = instance_id(c.path)
    if c.spare.considered(c.gate.enabled) and not sparefx.socket_place_known(ctx.env, instance):
        # The daemon decides this before any plan (sparefx.make): the spare is off, warned.
        detail, todo = sparefx.socket_problem(ctx.env, instance)
        return [CheckResult(NAME, FAIL if c.spare.enabled == "true" else WARN,
                            f"off when vllmwatch starts (spare.enabled = {c.spare.enabled}): "
                            "no private directory for the spare's Unix socket: "
                            f"{detail}; {todo}")]
    flags = flags_of(c)  # the daemon's own reading: the check says the plan it will make
    plan = spare.plan_spare(c.spare, c.gate.enabled, flags, _facts(ctx, flags, meminfo,
                                                                   serving))
    lines = plan.lines()
    if not plan.on:
        status = PASS if c.spare.enabled != "true" else (
            WARN if "unknown" in plan.reason else FAIL)
        return [CheckResult(NAME, status, "; ".join(lines))]
    head, serving_line, host_line, *notes = lines
    out = [CheckResult(NAME, PASS, head + (" (" + "; ".join(notes) + ")" if notes else "")),
           CheckResult("spare.serving", PASS, serving_line),
           CheckResult("spare.host", PASS, host_line)]
    return out


def _facts(ctx: Context, flags: dict[str, object], meminfo: Callable[[], Any],
           serving: Callable[[Context], bool] | None) -> spare.SpareFacts:
    c = ctx.config
    if not c.spare.considered(c.gate.enabled) or not c.vllm.uses_gpu:
        return spare.SpareFacts(platform="discrete" if c.vllm.uses_gpu else "cpu")

    unified = platform_of(ctx)[0].unified
    total, used = _gpu(ctx)
    running = (serving or serving_now)(ctx)
    info = meminfo()
    sleep_mode, uds = _vllm_flags(ctx)
    problems: list[str] = []  # a figure config.json gives of the wrong kind: said in the note
    weights, per_token, max_len = _model(ctx, flags, problems)
    return spare.SpareFacts(
        platform="unified" if unified else "discrete", gpu_total_mib=total,
        others_mib=None if running else used,  # our own engine's memory is not "others"
        host_available_mib=info.available_mib if info is not None else None,
        sleep_mode=sleep_mode, uds=uds, weights_mib=weights, kv_bytes_per_token=per_token,
        model_max_len=max_len, model_problem=problems[0] if problems else None)


def _gpu(ctx: Context) -> tuple[float | None, float | None]:
    """(total, used) MiB of the deployment's first GPU by NVML; None when not readable."""
    try:
        nvml = (ctx.nvml or load_nvml)()
    except Exception:
        return None, None
    if nvml is None:
        return None, None
    try:
        nvml.nvmlInit()
    except Exception:
        return None, None
    try:
        gpus = ctx.config.vllm.gpus
        mem = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(
            gpus[0] if gpus else 0))
        return mem.total / _MIB, mem.used / _MIB
    except Exception:  # absent, or unified memory (NotSupported): other rows say which
        return None, None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _vllm_flags(ctx: Context) -> tuple[bool | None, bool | None]:
    """Whether the installed vLLM has --enable-sleep-mode and --uds (None: unknown)."""
    c = ctx.config
    version = vllminfo.version(c.vllm.command)
    cache = ctx.flags_cache or vllmflags.default_cache_dir(c, ctx.env)
    known = vllmflags.known_flags(c.vllm.command, version, cache, ask=not ctx.fast) \
        if version is not None else None
    return vllmflags.spare_support(known)


def _model(ctx: Context, flags: dict[str, object], problems: list[str]
           ) -> tuple[float | None, int | None, int | None]:
    """(weights MiB, KV bytes per token, the model's context length) from local files: what
    the daemon's plan reads (shell/sparefx.model_figures), so the check says its plan."""
    return model_figures(ctx.config, ctx.env, str(flags.get("kv-cache-dtype", "auto")),
                         problems)
