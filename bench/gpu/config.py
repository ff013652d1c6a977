"""The vllmwatch configs the phases run, and the cache layout they measure."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from bench.gpu.run import TINY_KV, Run
from vllmwatch.testing.tomlfile import to_toml

# Multi-GPU hygiene on these machines (harmless on one GPU): never NVLink multicast.
# VLLM_USE_FLASHINFER_SAMPLER=0: vLLM 0.26's sampler fails without the flashinfer package.
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "VLLM_USE_FLASHINFER_SAMPLER": "0", "NCCL_NVLS_ENABLE": "0",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def watch_config(run: Run, name: str, model: Path, served: str, port: int, status_port: int,
                 cache: Path, args: dict[str, Any], gpus: tuple[int, ...] = (0,),
                 env: dict[str, str] | None = None, kernels: bool = False,
                 warmup_request: bool = True, memory: dict[str, Any] | None = None,
                 probe_interval: str = "1s", probe_threshold: int = 3,
                 shipped_probe: bool = False, restart: dict[str, Any] | None = None,
                 shipped_drain: bool = False, prewarm: dict[str, Any] | None = None,
                 tables: dict[str, dict[str, Any]] | None = None) -> Path:
    """A vllmwatch config for this run, written to WORK/NAME.toml; shipped_probe leaves
    [probe] out (vllmwatch's shipped defaults); `restart`, when given, replaces the bench's
    [restart] (the shipped defaults plus those keys); shipped_drain keeps [drain] out even
    in the dry run; `prewarm` adds [prewarm] keys (e.g. the start-up cache switches);
    `tables` adds whole tables (e.g. [gate] and [spare])."""
    conf: dict[str, dict[str, Any]] = {
        "vllm": {"command": [*run.vllm, "serve"], "model": str(model),
                 "served_model_name": served, "port": port, "gpus": list(gpus)},
        "vllm.env": {**VLLM_ENV, **(env or {})},
        "vllm.args": args,
        "startup": {"timeout": "15m"},
        "probe": {"interval": probe_interval, "timeout": "5s",
                  "failure_threshold": probe_threshold, "metrics_interval": "5s",
                  "canary_interval": "20s", "canary_timeout": "30s", **_dry_probe(run)},
        "memory": {"sample_interval": "1s", "pss_interval": "10s", "baseline_delay": "5s",
                   **(memory or {})},
        "restart": {**({"drain_timeout": "5s", "stop_timeout": "20s", "backoff_initial": "1s",
                        "gpu_release_timeout": "90s"} if restart is None else restart),
                    **_dry_restart(run)},
        "prewarm": {"cache_dir": str(cache), "kernels": kernels,
                    "warmup_request": warmup_request, **(prewarm or {})},
        "status": {"listen": f"127.0.0.1:{status_port}"},
        "log": {"format": "json"},
    }
    conf.update(tables or {})
    if run.dry and not shipped_drain:  # the dry run's planned restarts: no balancer to leave
        conf["drain"] = {"deregister_delay": 0}
    if shipped_probe:
        del conf["probe"]
    path = run.work / f"{name}.toml"
    path.write_text(f"# {name}: written by bench/gpu/config.py\n" + to_toml(conf))
    return path


def _dry_probe(run: Run) -> dict[str, Any]:
    """The dry run's probes: a hang (SIGSTOP) is caught in seconds, not in a minute."""
    if not run.dry:
        return {}
    return {"timeout": "1s", "metrics_interval": "1s", "canary_interval": "1s",
            "canary_timeout": "1s"}


def _dry_restart(run: Run) -> dict[str, Any]:
    """The dry run's restarts: the fake drains and stops in well under a second."""
    return {"drain_timeout": "1s", "stop_timeout": "3s", "backoff_initial": "0.2s"} \
        if run.dry else {}


def tiny_args(eager: bool = True) -> dict[str, Any]:
    """The tiny model's flags; eager (no compile, no CUDA graphs) where a phase tests
    supervision, not start speed."""
    args: dict[str, Any] = {"max-model-len": 2048, "kv-cache-memory-bytes": TINY_KV,
                            "dtype": "bfloat16"}
    return {**args, "enforce-eager": True} if eager else args


def big_config(run: Run, name: str, port: int, status_port: int, cache: Path,
               args: dict[str, Any] | None = None, **kw: Any) -> Path:
    """The Qwen3-8B-shaped model (served as q8b) with its flags plus args."""
    return watch_config(run, name, run.big, "q8b", port, status_port, cache,
                        {"max-model-len": 8192, "gpu-memory-utilization": 0.90,
                         "dtype": "bfloat16", **(args or {})}, **kw)


def cache_env(root: Path) -> dict[str, str]:
    """The cache variables vllmwatch sets for prewarm.cache_dir = root (prewarm.CACHE_VARS)."""
    return {"VLLM_CACHE_ROOT": str(root / "vllm"), "TRITON_CACHE_DIR": str(root / "triton"),
            "FLASHINFER_WORKSPACE_BASE": str(root / "flashinfer"),
            "HF_HOME": str(root / "huggingface")}


def du_mib(path: Path) -> float:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return round(total / 2**20, 1)
