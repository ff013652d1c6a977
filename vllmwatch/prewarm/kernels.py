"""Attention kernels warmed once in a throwaway subprocess of the vLLM venv's Python."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllmwatch.config import safefile
from vllmwatch.config.redact import REDACT
from vllmwatch.prewarm import backend

MARKER = "VLLMWATCH_KERNELS "
CANCEL_POLL = 0.2  # s between two looks at a cancel (a stop of the daemon) while it runs
# The pids of the warm scripts running now: children of ours in a session of their own, which
# a subreaper's sweep takes for adopted orphans (killed at a stop during the pre-warm and
# logged as an earlier vLLM's leftover). Their owner ends them (time limit, cancel): the
# sweep and the reaper leave them out (shell/effects.py _exempt).
RUNNING: set[int] = set()

# Runs in the vLLM venv. argv[1] is a JSON spec; prints one MARKER line of JSON.
SCRIPT = r'''
import json, os, sys, time
spec = json.loads(sys.argv[1])
out = {"requested": spec["backend"], "head_dim": spec["head_dim"], "dtype": spec["dtype"]}
def emit(**kw):
    out.update(kw)
    print("VLLMWATCH_KERNELS " + json.dumps(out), flush=True)
t0 = time.monotonic()
try:
    import torch
except Exception as exc:
    emit(ok=False, error="import torch: %s: %s" % (type(exc).__name__, exc)); sys.exit(0)
out["torch"] = torch.__version__
out["import_torch_s"] = round(time.monotonic() - t0, 3)
dev = spec.get("device", "cuda")
if dev == "cuda":
    if not torch.cuda.is_available():
        emit(ok=False, error="torch sees no CUDA device"); sys.exit(0)
    out["gpu"] = torch.cuda.get_device_name(0)
dtype = getattr(torch, spec["dtype"])
hq, hk, d, n = spec["num_heads"], spec["num_kv_heads"], spec["head_dim"], 16
def qkv(shape_q, shape_k):
    return (torch.randn(*shape_q, dtype=dtype, device=dev),
            torch.randn(*shape_k, dtype=dtype, device=dev),
            torch.randn(*shape_k, dtype=dtype, device=dev))
def flash_attn():
    from vllm.vllm_flash_attn import flash_attn_varlen_func
    q, k, v = qkv((n, hq, d), (n, hk, d))
    cu = torch.tensor([0, n], dtype=torch.int32, device=dev)
    # Without fa_version the interface runs FA2; vLLM runs FA3 on Hopper (spec says which).
    extra = {"fa_version": spec["fa_version"]} if spec.get("fa_version") else {}
    out["fa_version"] = spec.get("fa_version") or 2
    return lambda: flash_attn_varlen_func(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                          max_seqlen_q=n, max_seqlen_k=n, causal=True, **extra)
def flashinfer():
    import flashinfer
    q, k, v = qkv((n, hq, d), (n, hk, d))
    return lambda: flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True)
def sdpa():
    import torch.nn.functional as F
    q, k, v = qkv((1, hq, n, d), (1, hq, n, d))
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
def triton():
    import triton  # vLLM's Triton kernels need the paged-KV layout; load Triton itself
    out["triton"] = triton.__version__
    return sdpa()
backends = {"flash_attn": flash_attn, "flashinfer": flashinfer, "triton": triton, "sdpa": sdpa}
order = [spec["backend"]] if spec["backend"] != "auto" else ["flash_attn", "flashinfer", "sdpa"]
if "sdpa" not in order:
    order.append("sdpa")
tried = {}
for name in order:
    try:
        t1 = time.monotonic()
        call = backends[name]()
        out["import_s"] = round(time.monotonic() - t1, 3)
        t2 = time.monotonic(); call()
        if dev == "cuda": torch.cuda.synchronize()
        out["first_call_s"] = round(time.monotonic() - t2, 3)
        t3 = time.monotonic(); call()
        if dev == "cuda": torch.cuda.synchronize()
        out["second_call_s"] = round(time.monotonic() - t3, 3)
        emit(ok=True, backend=name, tried=tried, total_s=round(time.monotonic() - t0, 3))
        sys.exit(0)
    except Exception as exc:
        tried[name] = "%s: %s" % (type(exc).__name__, str(exc)[:300])
emit(ok=False, tried=tried, error="no attention backend ran")
'''

# vLLM backend names (backend.choose) -> what the script runs.
_BACKENDS = {"FLASH_ATTN": "flash_attn", "FLASHINFER": "flashinfer", "TRITON_ATTN": "triton",
             "TORCH_SDPA": "sdpa", "FLEX_ATTENTION": "sdpa"}
_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "half": "float16", "fp16": "float16",
           "float32": "float32", "float": "float32", "bf16": "bfloat16"}


@dataclass(frozen=True)
class KernelOutcome:
    """What the kernel step did: status, a one-line detail, and the script's JSON."""

    status: str  # ok | skipped | warn
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


def gpu_count() -> int:
    """NVIDIA GPUs NVML can see; 0 when NVML is missing or fails (no driver, no GPU)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # any NVML problem (no library, no driver) means no usable GPU here
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return 0
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def model_shape(model_dir: Path | None) -> dict[str, Any]:
    """Head size, head counts and dtype from the model's config.json (defaults if unreadable)."""
    spec: dict[str, Any] = {"head_dim": 128, "num_heads": 8, "num_kv_heads": 8,
                            "dtype": "bfloat16", "from_config": False}
    text = safefile.text_within(model_dir / "config.json", safefile.MAX_MODEL_CONFIG) \
        if model_dir else None
    try:
        raw = json.loads(text) if text is not None else None
    except ValueError:
        raw = None
    if not isinstance(raw, dict):
        return spec
    # Multimodal configs nest the language model's under text_config.
    cfg: dict[str, Any] = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
    from vllmwatch.config import modellen  # (at the warm-up only)

    try:  # a figure of the wrong kind (NaN, a string: config/modellen.py): the defaults
        heads = modellen.count(cfg, "num_attention_heads")
        hidden = modellen.count(cfg, "hidden_size")
        head_dim = modellen.count(cfg, "head_dim") or (
            hidden // heads if heads is not None and hidden is not None else None)
        kv_heads = modellen.count(cfg, "num_key_value_heads") or heads
        dtype = modellen.string(cfg, "torch_dtype") or modellen.string(cfg, "dtype") or ""
    except modellen.BadModelValue:
        return spec
    if head_dim and heads is not None:
        spec.update(head_dim=head_dim, num_heads=heads, from_config=True, num_kv_heads=kv_heads)
    spec["dtype"] = _DTYPES.get(dtype, spec["dtype"])
    return spec


def pick_backend(env: Mapping[str, str], args: Mapping[str, object],
                 version: str | None = None) -> str:
    """The backend set in the configuration (script name), or "auto" to try them in order."""
    name, _ = backend.requested(args, env, backend.parse_version(version))
    return _BACKENDS.get(name or "", "auto")


def gpu_capability(index: int = 0) -> tuple[int, int] | None:
    """Compute capability of NVML's GPU `index`; None without NVML or that GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library or no driver: no GPU to ask
        return None
    try:
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(
            pynvml.nvmlDeviceGetHandleByIndex(index))
        return int(major), int(minor)
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def plan(spec: Mapping[str, Any], env: Mapping[str, str], args: Mapping[str, object],
         version: str | None, cc: tuple[int, int] | None) -> dict[str, Any]:
    """The script spec for what vLLM `version` will run here (backend.choose), with why."""
    choice = backend.choose(cc, int(spec["head_dim"]), str(spec["dtype"]),
                            backend.parse_version(version), args, env)
    script = _BACKENDS.get(choice.backend, "auto") if cc is not None else pick_backend(
        env, args, version)
    return {**spec, "backend": script, "fa_version": choice.fa_version,
            "vllm_backend": choice.backend, "why": choice.reason, "capability": cc,
            "vllm_version": version}


def args_dtype(args: Mapping[str, object]) -> str | None:
    """The dtype given in [vllm.args], unless it is "auto"."""
    value = args.get("dtype")
    return _DTYPES.get(value) if isinstance(value, str) else None


# Before the script: it dies with the thread that started it (PR_SET_PDEATHSIG, SIGKILL;
# gone already: exit), as it runs in a session of its own that no stop of ours reaches.
_PRELUDE = """import ctypes as _c, os as _o, signal as _s
try:
    _c.CDLL(None, use_errno=True).prctl(1, int(_s.SIGKILL), 0, 0, 0)
except (OSError, AttributeError):
    pass
if _o.getppid() != {parent}:
    _o._exit(0)
"""


def run_script(python: str, spec: Mapping[str, Any], env: Mapping[str, str], timeout: float,
               script: str = SCRIPT, cancel: threading.Event | None = None) -> KernelOutcome:
    """Run the warm script in its own session; kill the whole group at the time limit, or
    once `cancel` is set (the daemon stops: its exit must not wait for the script)."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen([python, "-c", _PRELUDE.format(parent=os.getpid()) + script,
                                 json.dumps(spec)], env=dict(env),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    except OSError as exc:
        return KernelOutcome("warn", f"cannot run {python}: {exc.strerror or exc}")
    RUNNING.add(proc.pid)
    end = start + max(0.1, timeout)
    try:
        while True:  # (communicate again after its timeout loses no output: Python's docs)
            try:
                stdout, stderr = proc.communicate(timeout=max(0.01, min(
                    CANCEL_POLL, end - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if cancel is not None and cancel.is_set():
                    _kill_group(proc)
                    return KernelOutcome("warn", "asked to stop; killed")
                if time.monotonic() >= end:
                    _kill_group(proc)
                    return KernelOutcome("warn", f"timed out after "
                                         f"{time.monotonic() - start:.1f}s; killed",
                                         {"timeout_s": round(timeout, 3)})
    except BaseException:  # Ctrl-C at `vllmwatch prewarm`: its session got no SIGINT
        _kill_group(proc)
        raise
    finally:  # (after the wait: the script is reaped, its pid free for another process)
        RUNNING.discard(proc.pid)
    return _parse(stdout, stderr, proc.returncode)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    # A grandchild in another session could hold the pipes open; stop waiting after 5 s.
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=5)


def _parse(stdout: str, stderr: str, code: int) -> KernelOutcome:
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                data = json.loads(line[len(MARKER):])
            except ValueError:
                break
            if data.get("ok"):
                fa = f" FA{data['fa_version']}" if data.get("backend") == "flash_attn" else ""
                return KernelOutcome("ok", f"{data.get('backend')}{fa} head_dim="
                                     f"{data.get('head_dim')} {data.get('dtype')} first call "
                                     f"{data.get('first_call_s')}s", data)
            return KernelOutcome("warn", str(data.get("error")) + _tried(data), data)
    # Redacted whole, then split: splitlines() also splits at `\r`, `\x85`, `\u2028`, and a
    # secret's value parted from its name (`HF_TOKEN\rK`) passed the redactor alone, in clear
    cleaned = REDACT.tail(stderr.strip(), 1 << 16)
    tail = REDACT.head((cleaned.splitlines() or ["no output"])[-1], 300)
    return KernelOutcome("warn", f"warm script exited {code}: {tail}", {"exit_code": code})


def _tried(data: Mapping[str, Any]) -> str:
    tried = data.get("tried") or {}
    return ("; tried " + "; ".join(f"{k}: {v}" for k, v in tried.items())) if tried else ""

