"""The preflight checklist (`vllmwatch check`): the runner and the output.

The checks live in one module per group (vllm, model, maxlen, host, gpu, spare, ...), each
importing only check/base.py, so this module imports them all at the top. A check never
raises: the runner turns an unexpected error into a FAIL carrying its text.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any, TextIO

from vllmwatch.check import (
    fights,
    gpu,
    host,
    maxlen,
    model,
    neighbours,
    spare,
    startmem,
    unified,
    vllm,
)
from vllmwatch.check.base import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    Check,
    CheckResult,
    Context,
    exc_text,
)
from vllmwatch.config.command import load_for_reload
from vllmwatch.config.redact import REDACT
from vllmwatch.config.schema import ConfigError, load
from vllmwatch.core import exitcodes
from vllmwatch.prewarm import runner as prewarm
from vllmwatch.shell import reloadports

__all__ = [
    "CHECKS",
    "FAIL",
    "PASS",
    "SKIP",
    "WARN",
    "CheckResult",
    "Context",
    "config_only",
    "main",
    "render_json",
    "render_text",
    "run",
    "run_one",
]


def main(path: str, as_json: bool, fast: bool, *, nvml: Callable[[], Any] | None = None,
         out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the checklist for the config at path and print it: 0 if nothing failed; 78 (as
    `run` and `print-command` exit) when the config itself is refused, so a script tells a
    file to fix from a host to fix; else 1."""
    out, err = out or sys.stdout, err or sys.stderr
    show_progress = not as_json or err.isatty()
    results = run(path, fast=fast, env=os.environ, nvml=nvml,
                  progress=err if show_progress else None)
    try:
        print(render_json(results) if as_json else render_text(results, path), file=out)
        out.flush()
    except BrokenPipeError:  # `vllmwatch check | head`: the reader left; not our failure
        pass
    if any(r.status == FAIL and r.name == "config" for r in results):
        return exitcodes.CONFIG
    return 1 if any(r.status == FAIL for r in results) else 0


def run(path: str, *, fast: bool = False, env: Mapping[str, str] | None = None,
        nvml: Callable[[], Any] | None = None, progress: TextIO | None = None
        ) -> list[CheckResult]:
    """Load the config and run every check; a config that does not load is the only result."""
    try:
        config = load(path)
    except ConfigError as exc:
        return [CheckResult("config", FAIL, str(exc))]
    except Exception as exc:  # a bug in loading must still not print a traceback
        return [CheckResult("config", FAIL, f"{path}: cannot load: {exc_text(exc)}")]
    # The environment vLLM gets, its cache variables included (HF_HOME under the cache
    # root): the model rows looked in ~/.cache while vLLM reads the cache vllmwatch gives it
    child_env = prewarm.child_env(config, env if env is not None else os.environ)
    ctx = Context(config, fast, child_env, nvml, progress)
    results: list[CheckResult] = []
    for name, check in CHECKS:
        results += run_one(name, check, ctx)
    return results


def run_one(name: str, check: Check, ctx: Context) -> list[CheckResult]:
    """Run one check; an exception becomes a FAIL result instead of a traceback."""
    try:
        got = check(ctx)
    except OSError as exc:  # unreadable files, permissions: the operator's to fix
        return [CheckResult(name, FAIL, f"cannot read {exc.filename or ''}: {exc.strerror or exc}")]
    except Exception as exc:
        return [CheckResult(name, FAIL, f"check crashed: {exc_text(exc)} (a vllmwatch bug; "
                            "please report it)")]
    return got if isinstance(got, list) else [got]


def render_text(results: Sequence[CheckResult], path: str = "") -> str:
    """One line per result, aligned, then a count line."""
    width = max((len(r.name) for r in results), default=0)
    lines = [f"vllmwatch check: {REDACT.text(path)}"] if path else []  # (a row quotes it too)
    # Details quote the operator's values (a bad JSON flag, a URL): one redactor for all
    lines += [f"{r.status}  {r.name:<{width}}  {REDACT.text(r.detail)}" for r in results]
    counts = {s: sum(r.status == s for r in results) for s in (PASS, WARN, FAIL, SKIP)}
    lines.append(f"{counts[PASS]} passed, {counts[WARN]} warned, {counts[FAIL]} failed, "
                 f"{counts[SKIP]} skipped")
    return "\n".join(lines)


def render_json(results: Sequence[CheckResult]) -> str:
    """A JSON list of {name, status, detail}."""
    return json.dumps([{**asdict(r), "detail": REDACT.text(r.detail)} for r in results],
                      indent=2)


def _check_gpus(ctx: Context) -> list[CheckResult]:
    return gpu.check_gpus(ctx.config.vllm.gpus, ctx.nvml or gpu.load_nvml)


def _check_start_memory(ctx: Context) -> list[CheckResult]:
    if host.serving_now(ctx):  # its memory counts as used: the check would refuse itself
        return [CheckResult(startmem.NAME, PASS, "this deployment's vLLM is running (it holds "
                            "the memory vLLM's start-up check would ask for)")]
    return startmem.check_start_memory(ctx, nvml=ctx.nvml or gpu.load_nvml)


CHECKS: tuple[tuple[str, Check], ...] = (
    ("config", vllm.check_config),
    ("vllm", vllm.check_vllm),
    ("vllm.args", vllm.check_vllm_args),
    ("relative paths", vllm.check_relative_paths),
    ("start caches", vllm.check_start_caches),
    ("model", model.check_model),
    ("max-model-len", maxlen.check_max_model_len),
    ("port", host.check_port),
    ("gate", host.check_gate_beside),
    ("gate.listen", host.check_gate_listen),
    ("status.listen", vllm.check_status_listen),
    ("lora.live", vllm.check_lora_live),
    ("gpu", _check_gpus),
    ("start memory", _check_start_memory),
    ("platform", unified.check_platform),
    ("spare", spare.check_spare),
    ("prewarm.cache_dir", host.check_prewarm_cache),
    ("instances", neighbours.check_neighbours),
    ("fights", fights.check_fights),
)


def config_only(path: str, as_json: bool, out: TextIO | None = None) -> int:
    """`check --config-only`: what a reload would apply, nothing else (the units' first
    ExecReload=). 0 when a SIGHUP would take it; exit code CONFIG when it would be refused,
    so that `systemctl reload` fails and `systemctl status` shows why."""
    out = out or sys.stdout
    try:
        config = load_for_reload(path)
        # What the daemon's reload refuses beyond the file: an address it would bind that
        # another process holds. The running config is not known here: every address is
        # looked at, and this instance's own vllmwatch and vLLM are recognised by pid
        reloadports.refuse_busy(path, config, None, host.whose_here(Context(
            config, env=os.environ)), unseen=host.sees_ours(os.environ))
        result = CheckResult("config", PASS, f"loads (sha256 {config.sha256[:12]}); a reload "
                             "applies it")
    except ConfigError as exc:
        result = CheckResult("config", FAIL, f"{exc}; a reload would keep the running config")
    except Exception as exc:  # a bug in loading must still not print a traceback
        result = CheckResult("config", FAIL, f"{path}: cannot load: {exc_text(exc)}")
    try:
        print(render_json([result]) if as_json else render_text([result], path), file=out)
        out.flush()
    except BrokenPipeError:
        pass
    return exitcodes.OK if result.status == PASS else exitcodes.CONFIG
