"""Phases probe0 and probe: the machine before the install, and what vLLM finds on it after
(imports, FlashAttention versions, the backend vLLM and vllmwatch pick); and the direct FA
warm-up the prewarm phase compares with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from bench.gpu.run import Run

PACKAGES = ("torch transformers tokenizers numpy numba protobuf setuptools triton "
            "huggingface-hub safetensors pillow opencv-python-headless uvloop aiohttp "
            "prometheus-client nvidia-ml-py psutil pydantic fastapi starlette openai "
            "jsonschema pyzmq msgspec xgrammar")


def probe0(run: Run) -> None:
    sh = run.sh
    run.emit("probe0", "host", uname=sh("uname -a"), python=sys.version.split()[0],
             executable=sys.executable, nproc=os.cpu_count(),
             mem=sh("grep -E 'MemTotal|MemAvailable' /proc/meminfo"),
             disk=sh("df -h / /tmp | tail -n +2"), xz=sh("command -v xz zstd gcc nvcc"),
             purelib=sh(f"{sys.executable} -c 'import sysconfig;"
                        f"print(sysconfig.get_paths()[\"purelib\"])'"))
    run.emit("probe0", "gpu", nvidia_smi=sh("nvidia-smi --query-gpu=name,driver_version,"
                                            "memory.total,memory.used --format=csv,noheader"),
             cuda=sh("nvidia-smi | grep -o 'CUDA Version: [0-9.]*'"), nvml=run.nv.snapshot())
    run.emit("probe0", "packages", pip=sh(f"{sys.executable} -m pip list 2>/dev/null | "
                                          f"grep -iwE '{'|'.join(PACKAGES.split())}'"))


PROBE_CODE = r'''
import json, time, sys
t = time.monotonic(); out = {}
import torch, vllm
out["import_vllm_s"] = round(time.monotonic() - t, 2)
out["vllm"] = vllm.__version__; out["torch"] = torch.__version__
out["gpu"] = torch.cuda.get_device_name(0); out["cc"] = torch.cuda.get_device_capability(0)
from vllm.platforms import current_platform
out["platform"] = type(current_platform).__name__
import vllm._C_stable_libtorch
from vllm.vllm_flash_attn import flash_attn_interface as fi
out["fa2"] = [fi.FA2_AVAILABLE, fi.FA2_UNAVAILABLE_REASON]
out["fa3"] = [fi.FA3_AVAILABLE, fi.FA3_UNAVAILABLE_REASON]
out["fa4"] = [fi.FA4_AVAILABLE, fi.FA4_UNAVAILABLE_REASON]
from vllm.v1.attention.backends.fa_utils import get_flash_attn_version
out["fa_version_hd64"] = get_flash_attn_version(head_size=64)
out["fa_version_hd128"] = get_flash_attn_version(head_size=128)
missing = {}
for m in ["vllm.entrypoints.openai.api_server", "vllm.v1.engine.core",
          "vllm.v1.worker.gpu_model_runner", "vllm.v1.attention.backends.flash_attn",
          "vllm.model_executor.models.qwen3", "vllm.v1.sample.sampler",
          "vllm.compilation.backends", "vllm.v1.structured_output.backend_xgrammar"]:
    try:
        __import__(m)
    except Exception as e:
        missing[m] = "%s: %s" % (type(e).__name__, e)
out["import_errors"] = missing
try:
    from vllmwatch.prewarm import backend as B
    for hd in (64, 128):
        c = B.choose(tuple(out["cc"]), hd, "bfloat16", B.parse_version(vllm.__version__), {}, {})
        out["vllmwatch_choice_hd%d" % hd] = [c.backend, c.fa_version, c.reason]
except Exception as e:
    out["vllmwatch_choice"] = "%s: %s" % (type(e).__name__, e)
for name in ["flashinfer", "deep_gemm", "cutlass", "tilelang"]:
    try:
        __import__(name); out["has_" + name] = True
    except Exception as e:
        out["has_" + name] = "%s" % type(e).__name__
print("PROBE " + json.dumps(out, default=str))
'''


def probe(run: Run) -> None:
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-c", PROBE_CODE], capture_output=True, text=True,
                       timeout=240)
    (run.logs / "probe.log").write_text(r.stdout + r.stderr)
    res = next((json.loads(ln[6:]) for ln in r.stdout.splitlines() if ln.startswith("PROBE ")),
               {"rc": r.returncode, "stderr_tail": r.stderr[-2000:]})
    run.emit("probe", "vllm", seconds=round(time.monotonic() - t, 1), **res)
    run.emit("probe", "versions",
             vllm_cli=run.sh(f"{run.cmd(run.vllm)} --version", 120).splitlines()[-1:],
             vllmwatch=run.sh(f"{run.cmd(run.vllmwatch)} --version"))


FA_SCRIPT = r'''
import json, sys, time
t0 = time.monotonic()
import torch
from vllm.vllm_flash_attn.flash_attn_interface import flash_attn_varlen_func
spec = json.loads(sys.argv[1]); out = {"import_s": round(time.monotonic() - t0, 3)}
n, hq, hk, d = 16, spec["hq"], spec["hk"], spec["d"]
q = torch.randn(n, hq, d, dtype=torch.bfloat16, device="cuda")
k = torch.randn(n, hk, d, dtype=torch.bfloat16, device="cuda"); v = torch.randn_like(k)
cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
for fa in spec["versions"]:
    try:
        t = time.monotonic()
        flash_attn_varlen_func(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=n,
                               max_seqlen_k=n, causal=True, fa_version=fa)
        torch.cuda.synchronize(); first = time.monotonic() - t
        t = time.monotonic()
        flash_attn_varlen_func(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=n,
                               max_seqlen_k=n, causal=True, fa_version=fa)
        torch.cuda.synchronize()
        out["fa%d" % fa] = {"first_call_s": round(first, 4),
                            "second_call_s": round(time.monotonic() - t, 4)}
    except Exception as e:
        out["fa%d" % fa] = "%s: %s" % (type(e).__name__, str(e)[:200])
out["total_s"] = round(time.monotonic() - t0, 3)
print("FA " + json.dumps(out))
'''


def fa_direct(run: Run, phase: str, hq: int, hk: int, d: int) -> None:
    """FlashAttention 3 and 2 called directly in a fresh process: first and second call."""
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-c", FA_SCRIPT, json.dumps(
        {"hq": hq, "hk": hk, "d": d, "versions": [3, 2]})], capture_output=True, text=True,
        timeout=180)
    res = next((json.loads(ln[3:]) for ln in r.stdout.splitlines() if ln.startswith("FA ")),
               {"rc": r.returncode, "stderr": r.stderr[-800:]})
    run.emit(phase, "fa_direct", heads=[hq, hk], head_dim=d,
             wall_s=round(time.monotonic() - t, 2), **res)
