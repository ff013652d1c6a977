"""vLLM's start-up caches as the fake vLLM plays them (issue 33): what a start of the fake
EngineCore finds and leaves under VLLM_CACHE_ROOT, and the lines vLLM prints about it (the
ones core/reuse.py reads). Apart from the engine (fake_engine.py) because it is a file
protocol of its own: which variables ask for which cache, where the files go, which line says
saved, loaded or not applied."""

from __future__ import annotations

import contextlib
import os

PLAN_KV = 1 << 30  # the fake's "profiled" KV cache size


def start_caches(env: dict[str, str] | os._Environ[str]
                 ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """vLLM's start-up caches as the fake plays them (issue 33), only where the variables ask:
    the mega AOT artifact (VLLM_USE_MEGA_AOT_ARTIFACT=1) and the startup plan
    (VLLM_ENABLE_STARTUP_PLAN=1) under VLLM_CACHE_ROOT: the first start writes, the next
    read, with vLLM's own lines (core/reuse.py). FAKE_PLAN_FREE_BELOW=1 plays a start whose
    free memory is below the plan's baseline."""
    root = env.get("VLLM_CACHE_ROOT")
    aot: list[tuple[str, str]] = []
    plan: list[tuple[str, str]] = []
    if not root:
        return aot, plan
    if env.get("VLLM_USE_MEGA_AOT_ARTIFACT") == "1":
        path = os.path.join(root, "torch_compile_cache", "torch_aot_compile", "fake",
                            "rank_0_0", "model")
        if os.path.exists(path):
            aot.append(("decorators.py:311", f"Directly load AOT compilation from path {path}"))
        else:
            _touch(path)
            aot.append(("decorators.py:708", f"saved AOT compiled function to {path}"))
    if env.get("VLLM_ENABLE_STARTUP_PLAN") == "1":
        path = os.path.join(root, "startup_plan", "startup_plan_0123456789abcdef.json")
        if os.path.exists(path) and env.get("FAKE_PLAN_FREE_BELOW") == "1":
            plan.append(("startup_plan.py:150", "Startup plan not applied: current free "
                         "memory (0.50 GiB) is below the recorded baseline (1.00 GiB); "
                         "falling back to full memory profiling."))
        elif os.path.exists(path):
            plan.append(("startup_plan.py:160", "Applying persisted startup plan (fingerprint "
                         f"0123456789abcdef): kv_cache_memory_bytes={PLAN_KV} (1.00 GiB), "
                         "recorded free-memory baseline 1.00 GiB, current 1.00 GiB. Memory "
                         "profiling will be skipped."))
        else:
            _touch(path)
            plan.append(("startup_plan.py:190", f"Saved startup plan to {path}"))
    return aot, plan


def _touch(path: str) -> None:
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a", encoding="utf-8"):
            pass
