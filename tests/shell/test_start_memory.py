"""Issue 36.2: `check` refuses what vLLM's start-up memory check will refuse: on CPU the
guide's `gpu-memory-utilization 0.92` (a fraction of host memory there), on a GPU less free
memory than utilization x total; sized KV caches skip the rule, as in vLLM."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from vllmwatch.check.base import FAIL, PASS, WARN, Context
from vllmwatch.check.startmem import check_start_memory, node_memory
from vllmwatch.config.schema import from_dict

GIB = 1 << 30


def ctx(gpus: list[int] | None, args: dict[str, Any], env: dict[str, str] | None = None
        ) -> Context:
    return Context(from_dict({"vllm": {"model": "/m", "gpus": "all" if gpus is None else gpus,
                                       "args": args, "env": env or {}}}))


@pytest.mark.parametrize(("args", "env", "free", "status", "words"), [
    # the guide's line as a CPU deployment: 0.92 x 24 GiB > 20 GiB available
    ({"gpu-memory-utilization": 0.92}, {}, 20, FAIL, ["will refuse", "at most 0.71"]),
    ({}, {}, 20, FAIL, ["0.9 x"]),  # vLLM's default 0.9 asks as much
    ({"gpu-memory-utilization": 0.75}, {}, 20, WARN, ["may refuse"]),
    ({"gpu-memory-utilization": 0.3}, {}, 20, PASS, ["7.2 GiB"]),
    ({"gpu-memory-utilization": 0.92, "kv-cache-memory-bytes": "1G"}, {}, 20, PASS, ["skips"]),
    ({"gpu-memory-utilization": 0.92}, {"VLLM_CPU_KVCACHE_SPACE": "1"}, 20, PASS, ["skips"]),
])
def test_a_cpu_deployment_is_held_to_vllms_host_memory_rule(
        args: dict[str, Any], env: dict[str, str], free: int, status: str,
        words: list[str]) -> None:
    got = check_start_memory(ctx([], args, env), meminfo=lambda: (24 * GIB, free * GIB))
    assert [r.status for r in got] == [status], got
    assert all(w in got[0].detail for w in words), got[0].detail


class FakeNvml:
    """Two GPUs of 80 GiB; GPU 1 has 60 GiB held by someone else."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: return 2
    def nvmlDeviceGetHandleByIndex(self, i: int) -> int: return i

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(total=80 * GIB, free=(80 - 60 * h) * GIB)


def test_a_gpu_with_less_free_memory_than_asked_fails_by_index() -> None:
    got = check_start_memory(ctx(None, {"gpu-memory-utilization": 0.5}), nvml=FakeNvml)
    assert [(r.status, r.detail.split(":")[0]) for r in got] == [(PASS, "GPU 0"),
                                                                 (FAIL, "GPU 1")]
    assert "at most 0.24" in got[1].detail
    assert [r.status for r in check_start_memory(ctx([0], {}), nvml=FakeNvml)] == [PASS]


def test_kv_cache_bytes_do_not_skip_the_gpu_check() -> None:
    """vLLM's request_memory() runs on a GPU whatever the KV sizing (issue 34): utilization
    x total must still be free."""
    got = check_start_memory(ctx([1], {"gpu-memory-utilization": 0.9,
                                       "kv-cache-memory-bytes": "8G"}), nvml=FakeNvml)
    assert [r.status for r in got] == [FAIL] and "at most 0.24" in got[0].detail


def test_node_memory_reads_numa_node_0_like_vllm_else_meminfo(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 1000 kB\nMemFree: 100 kB\n"
                                           "MemAvailable: 600 kB\n")
    assert node_memory(str(tmp_path)) == (1000 * 1024, 600 * 1024)
    node = tmp_path / "sys/devices/system/node/node0"
    node.mkdir(parents=True)
    (node / "meminfo").write_text("Node 0 MemTotal: 800 kB\nNode 0 MemFree: 100 kB\n"
                                  "Node 0 Active(file): 50 kB\nNode 0 Inactive(file): 30 kB\n")
    assert node_memory(str(tmp_path)) == (800 * 1024, 180 * 1024)
    assert node_memory(str(tmp_path / "none")) is None
