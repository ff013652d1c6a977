"""Pre-warm before a start: persistent caches, weights in the page cache, attention kernels."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from vllmwatch.config import command, safefile, vllminfo
from vllmwatch.config.convert import printable
from vllmwatch.config.redact import REDACT
from vllmwatch.config.schema import Config
from vllmwatch.logfn import LogFn
from vllmwatch.prewarm import evict, kernels, pagecache

# Variable -> subdirectory of the cache root. FlashInfer keeps its JIT cache under
# $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer (flashinfer/jit/env.py).
CACHE_VARS = {"VLLM_CACHE_ROOT": "vllm", "TRITON_CACHE_DIR": "triton",
              "FLASHINFER_WORKSPACE_BASE": "flashinfer", "HF_HOME": "huggingface"}
RESIDENT_ENOUGH = 0.9
Step = Callable[[], tuple[str, str, dict[str, Any]]]  # (status, detail, data)
NESTED = ("torch_compile", "aot_artifacts", "startup_plan")  # inside "vllm": counted there
# Folders below a variable's that vLLM (FlashInfer) loads code from: refused as the variable's.
LOADED = {"VLLM_CACHE_ROOT": ("torch_compile_cache", "torch_compile_cache/torch_aot_compile"),
          "FLASHINFER_WORKSPACE_BASE": (".cache", ".cache/flashinfer")}

# vLLM's compilation backend, on loading a graph compiled by an earlier start, logs e.g.
# "Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 0.7 s"
# (older: "... for dynamic shape ..." / "... for shape N ..."), and with AOT compilation
# "Directly load AOT compilation from path ...".
_HIT = re.compile(r"Directly load (the compiled graph\(s\) for .* from the cache"
                  r"|AOT compilation from path)")


@dataclass(frozen=True)
class StepResult:
    """One pre-warm step: ok | skipped | warn | failed, a one-line detail, and figures."""

    name: str
    status: str
    detail: str
    seconds: float
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PrewarmReport:
    """All steps; ok is False only when a step failed and prewarm.required is set."""

    steps: tuple[StepResult, ...]
    ok: bool

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON output and /status."""
        return {"ok": self.ok, "steps": [asdict(s) for s in self.steps]}


@dataclass(frozen=True)
class Hooks:
    """Seams for tests: GPU detection, the reader, the kernel script and interpreter."""

    gpu_count: Callable[[], int] = kernels.gpu_count
    reader: pagecache.Reader | None = None
    python: str | None = None
    kernel_script: str = kernels.SCRIPT
    progress_every: float = 5.0
    unified: Callable[[Config], bool] | None = None  # None: discrete memory
    cancel: threading.Event | None = None  # set: the daemon stops; the step under way ends


def cache_root(config: Config, environ: Mapping[str, str]) -> str:
    """systemd's $CACHE_DIRECTORY (first entry) when set, else prewarm.cache_dir."""
    first = environ.get("CACHE_DIRECTORY", "").split(":")[0]
    return first or config.prewarm.cache_dir


def cache_env(config: Config, environ: Mapping[str, str]) -> dict[str, str]:
    """Cache variables to add to the child's environment, never overriding the user's. Pure."""
    if not config.prewarm.enabled:
        return {}
    root = cache_root(config, environ)
    return {var: os.path.join(root, sub) for var, sub in CACHE_VARS.items()
            if var not in config.vllm.env and var not in environ}


def child_env(config: Config, environ: Mapping[str, str]) -> dict[str, str]:
    """The child's environment as far as caches go: [vllm.env] over our environment over our
    cache variables (cache_env never overrides the user's). Pure."""
    return {**environ, **cache_env(config, environ), **config.vllm.env}


def cannot_make(path: str, var: str = "") -> str | None:
    """Why make_cache_dirs would find `path` (of `var`) unusable for us now, without making
    anything (`print-command`: a line to run by hand must not create dirs); None: usable."""
    where = Path(path)
    try:  # lexists: a dangling symlink (an unmounted disk) is no place makedirs can use
        while not os.path.lexists(where) and where.parent != where:
            where = where.parent  # the directory that mkdir -p would make it in
        if not where.is_dir():
            return f"{where} is not a directory"
    except OSError as exc:  # EACCES: a parent this user cannot search
        return f"{where}: {exc.strerror or exc}"
    if not os.access(where, os.W_OK | os.X_OK):
        return f"{where} is not writable"
    return _shared(str(where.parent), str(where), var if where == Path(path) else "")  # root


def make_cache_dirs(config: Config, environ: Mapping[str, str]
                    ) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    """Create our cache directories: (the variables whose directory is usable, and [(variable,
    path, why)] for the rest: vLLM would crash on an unwritable one, run others' code)."""
    usable: dict[str, str] = {}
    problems: list[tuple[str, str, str]] = []
    for var, path in cache_env(config, environ).items():
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)  # the umask narrows it further
        except OSError as exc:
            problems.append((var, path, exc.strerror or str(exc)))
            continue
        root = cache_root(config, environ)
        why = "not writable" if not os.access(path, os.W_OK) else _shared(root, path, var)
        if why is None:
            usable[var] = path
        elif why != "not writable" and var != "HF_HOME" and (  # a new HF_HOME: a new download
                private := safefile.private_cache(environ, CACHE_VARS[var])):
            usable[var] = private  # vLLM's default may be the refused root itself (the unit's
            # XDG_CACHE_HOME): its compiled code goes where only we can write, meanwhile
            problems.append((var, path, f"{why}; using {private} (this service's own) until "
                             "the permissions are fixed"))
        else:  # left out, vLLM (Triton, ...) takes its own default: is that elsewhere?
            default = str(_cache_dirs(config, {**environ, var: ""})[CACHE_VARS[var]])
            same = os.path.commonpath([os.path.realpath(default), os.path.realpath(root)])
            problems.append((var, path, why if same != os.path.realpath(root) or why ==
                             "not writable" else f"{why}; and its default without {var}, "
                             f"{default}, is under the same {root}: fix the permissions, "
                             "until then nothing keeps others' code out"))
    return usable, problems


def _shared(root: str, path: str, var: str) -> str | None:  # vLLM loads what its caches
    paths = (root, path, *(os.path.join(path, sub) for sub in LOADED.get(var, ())))  # hold
    why = next(filter(None, map(safefile.shared_dir, paths)), None)  # as code (Python)
    return None if why is None else f"{why}: another user could plant code that vLLM loads"


def _cache_dirs(config: Config, environ: Mapping[str, str]) -> dict[str, Path]:
    """Where the child's caches live: config env, then environ, then ours, then defaults."""
    env = child_env(config, environ)
    home = Path(env.get("HOME") or str(Path.home()))
    xdg = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
    vllm = Path(env.get("VLLM_CACHE_ROOT") or xdg / "vllm")
    fi_base = Path(env.get("FLASHINFER_WORKSPACE_BASE") or home)
    # Issue 33: vLLM's startup plans and AOT artifacts (mega or not) live inside these two.
    return {"vllm": vllm, "torch_compile": vllm / "torch_compile_cache",
            "aot_artifacts": vllm / "torch_compile_cache" / "torch_aot_compile",
            "startup_plan": vllm / "startup_plan",
            "triton": Path(env.get("TRITON_CACHE_DIR") or home / ".triton" / "cache"),
            "flashinfer": fi_base / ".cache" / "flashinfer",
            "huggingface": Path(env.get("HF_HOME") or xdg / "huggingface")}


def cache_report(config: Config, environ: Mapping[str, str],
                 time_limit: float = 2.0) -> dict[str, Any]:
    """Each cache's path, whether it exists, its size on disk and file count (like du)."""
    deadline = time.monotonic() + time_limit
    out: dict[str, Any] = {}
    for name, path in _cache_dirs(config, environ).items():
        entry: dict[str, Any] = {"path": str(path), "exists": path.is_dir()}
        if entry["exists"]:
            entry.update(pagecache.du(path, deadline))
        out[name] = entry
    return out


def compile_cache_hit(line: str) -> bool:
    """True for vLLM's log line that says a start loaded compiled graphs from the cache."""
    return _HIT.search(line) is not None


def _step_caches(config: Config, environ: Mapping[str, str], deadline: float
                 ) -> tuple[str, str, dict[str, Any]]:
    ours = cache_env(config, environ)
    _usable, unusable = make_cache_dirs(config, environ)
    problems = [f"{var}={path}: {why}" for var, path, why in unusable]
    report = cache_report(config, environ, max(0.0, min(10.0, deadline - time.monotonic())))
    data = {"env": ours, "caches": report, "env_usable": not problems}
    total = sum(c.get("bytes", 0) for k, c in report.items() if k not in NESTED)
    compiled = report["torch_compile"].get("bytes", 0)
    if problems:
        return "warn", (f"cannot create cache dirs under prewarm.cache_dir "
                        f"{cache_root(config, environ)!r}: " + "; ".join(problems)), data
    placed = ", ".join(ours) if ours else "none (all set by the user)"
    return "ok", f"placed {placed}; caches {_mib(total)}, compile cache {_mib(compiled)}", data


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def model_dir(config: Config, environ: Mapping[str, str]) -> Path | None:
    """The local directory (or file) of the model: a path, or a hub id already downloaded."""
    path = Path(config.vllm.model).expanduser()
    if path.exists():
        return path
    if config.vllm.model.count("/") == 1 and not config.vllm.model.startswith(("/", ".")):
        env = child_env(config, environ)
        return pagecache.hub_snapshot(config.vllm.model, pagecache.hub_cache_dir(env))
    return None


def _step_page_cache(config: Config, environ: Mapping[str, str], deadline: float, log: LogFn,
                     hooks: Hooks) -> tuple[str, str, dict[str, Any]]:
    where = model_dir(config, environ)
    files = pagecache.weight_files(where) if where else []
    if not files:
        return "skipped", f"no local weight files for vllm.model {config.vllm.model!r}", {}
    # unified: the caller decides (the daemon's one platform decision; the CLI asks
    if hooks.unified is not None and hooks.unified(config):  # shell.platform), not prewarm/
        return evict.step(files, log)
    total = sum(p.stat().st_size for p in files)
    before = pagecache.residency(files)
    data: dict[str, Any] = {"files": len(files), "total_bytes": total, "resident_before": before}
    if before is not None and before >= RESIDENT_ENOUGH:
        return "skipped", f"already resident ({before:.0%} of {_mib(total)})", data
    budget = psutil.virtual_memory().available * config.prewarm.page_cache_max_fraction
    data["budget_bytes"] = int(budget)
    if total > budget:
        return "skipped", (f"{_mib(total)} of weights would not fit in "
                           f"prewarm.page_cache_max_fraction = "
                           f"{config.prewarm.page_cache_max_fraction:g} of available memory "
                           f"({_mib(int(budget))})"), data
    extra = {"reader": hooks.reader} if hooks.reader else {}
    res = pagecache.warm(files, config.prewarm.page_cache_workers, deadline, log,
                         progress_every=hooks.progress_every, cancel=hooks.cancel, **extra)
    rate = res.read_bytes / 2**20 / res.seconds if res.seconds > 0 else 0.0
    data.update(read_bytes=res.read_bytes, mib_per_s=round(rate, 1), errors=list(res.errors),
                resident_after=pagecache.residency(files))
    if res.errors:
        return "warn", f"read errors: {'; '.join(res.errors[:3])}", data
    if not res.finished:
        return "warn", (f"{'asked to stop' if res.cancelled else 'prewarm.timeout reached'} "
                        f"after {_mib(res.read_bytes)} of {_mib(total)}; stopped reading"), data
    return "ok", f"read {_mib(total)} in {len(files)} files at {rate:.0f} MiB/s", data


def _step_kernels(config: Config, environ: Mapping[str, str], deadline: float,
                  hooks: Hooks) -> tuple[str, str, dict[str, Any]]:
    if not config.vllm.uses_gpu or hooks.gpu_count() == 0:
        return "skipped", "skipped: no GPU", {}
    python = hooks.python or vllminfo.interpreter(config.vllm.command)
    if python is None:
        return "warn", f"cannot find the Python of vllm.command {config.vllm.command!r}", {}
    usable = make_cache_dirs(config, environ)[0]  # as a launch: the script JIT-loads kernels
    try:  # from them (Triton's, FlashInfer's), so never from one another user can write
        env = dict(command.build(config, environ, extra_env=usable).env)
    except Exception:  # a bad command is `check`'s to report, not ours
        env = {**environ, **usable, **config.vllm.env}
    spec = kernels.model_shape(model_dir(config, environ))
    spec["dtype"] = kernels.args_dtype(config.vllm.args) or spec["dtype"]
    gpu = config.vllm.gpus[0] if config.vllm.gpus else 0  # vLLM's first (rank 0) GPU
    spec = kernels.plan(spec, env, config.vllm.args, vllminfo.version(config.vllm.command),
                        kernels.gpu_capability(gpu))
    out = kernels.run_script(python, spec, env, deadline - time.monotonic(),
                             script=hooks.kernel_script, cancel=hooks.cancel)
    return out.status, out.detail, {**out.data, "spec": spec}


def run(config: Config, log: LogFn, environ: Mapping[str, str],
        hooks: Hooks | None = None) -> PrewarmReport:
    """Run every enabled step within prewarm.timeout overall; problems warn unless required."""
    hooks = hooks or Hooks()
    p = config.prewarm
    deadline = time.monotonic() + p.timeout
    # As root in caches another user owns (`sudo vllmwatch prewarm` beside the unit's
    # User=vllmwatch): what root would create there (0700 directories, JIT kernels) stays
    # root's, and the service could no longer write, or even read, its own cache: the steps
    # that write refuse (a warning) and say how to run it.
    theirs = safefile.foreign_owner([cache_root(config, environ), *(  # (weights: read only)
        str(path) for name, path in _cache_dirs(config, environ).items() if name != "huggingface")])
    refuse: Step | None = None if theirs is None else (lambda: (
        "warn", f"running as root would leave root-owned files in {theirs[0]} (owned by "
        f"{theirs[1]}), which that user could not write: run `sudo -u {theirs[1]} vllmwatch "
        "prewarm`", {}))
    steps: list[tuple[str, bool, Step]] = [
        ("caches", p.enabled, refuse or (lambda: _step_caches(config, environ, deadline))),
        ("page_cache", p.enabled and p.page_cache,
         lambda: _step_page_cache(config, environ, deadline, log, hooks)),
        ("kernels", p.enabled and p.kernels,
         refuse or (lambda: _step_kernels(config, environ, deadline, hooks))),
    ]
    results = tuple(_one(name, on, fn, deadline, p.required, log) for name, on, fn in steps)
    ok = not any(r.status == "failed" for r in results)
    return PrewarmReport(results, ok)


def _one(name: str, enabled: bool, fn: Callable[[], tuple[str, str, dict[str, Any]]],
         deadline: float, required: bool, log: LogFn) -> StepResult:
    start = time.monotonic()
    data: dict[str, Any]
    if not enabled:
        status, detail, data = "skipped", "disabled in [prewarm]", {}
    elif start >= deadline:
        status, detail, data = "warn", "prewarm.timeout used up before this step", {}
    else:
        log("info", "prewarm.step.start", step=name)
        try:
            status, detail, data = fn()
        except Exception as exc:  # a pre-warm bug must never stop a start
            status, detail, data = "warn", f"{type(exc).__name__}: {exc}", {}
    if status == "warn" and required:
        status = "failed"
    result = StepResult(name, status, detail, round(time.monotonic() - start, 3), data)
    log("info", "prewarm.step", step=name, status=status, detail=detail, seconds=result.seconds)
    return result


def _stderr_log(level: str, event: str, **fields: Any) -> None:
    tag = "" if level == "info" else f"{level.upper()} "
    print(_out(f"{tag}{event} " + " ".join(f"{k}={v}" for k, v in fields.items())),
          file=sys.stderr, flush=True)


def _out(text: str) -> str:  # one line: redacted, control characters as escapes
    return printable(REDACT.text(text.rstrip()), keep_newlines=False)


def main(config: Config, as_json: bool = False, unified: bool = False) -> int:
    """`vllmwatch prewarm`: run the steps now, print a report; 1 if a required step failed.
    `unified`: the box has unified memory (the caller asks shell.platform): evict, not warm."""
    report = run(config, _stderr_log, os.environ, Hooks(unified=lambda _c: unified))
    if as_json:
        print(json.dumps(REDACT.deep(report.to_dict()), indent=2, default=str))
    else:
        for s in report.steps:
            print(_out(f"{s.name:<11} {s.status:<8} {s.seconds:7.1f}s  {s.detail}"))
        for name, c in cache_report(config, os.environ).items():
            size = _mib(c["bytes"]) + (" (partial)" if c.get("partial") else "") \
                if c["exists"] else "absent"
            print(_out(f"cache {name:<14} {size:>14}  {c['path']}"))
    return 0 if report.ok else 1
