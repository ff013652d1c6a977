"""`vllmwatch check` on the platform: discrete says so in one line; unified memory shows
MemFree/MemAvailable, the model's page-cache residency, what vLLM's start-up check will
demand against what it will see, and warns about KV sizing from gpu-memory-utilization."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from vllmwatch.check import runner as check
from vllmwatch.check import unified as cu
from vllmwatch.config.schema import from_dict
from vllmwatch.core.unified import MemInfo
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml, NVMLError_DriverNotLoaded

GIB = 1024.0
SPARK = MemInfo(total_mib=121.6 * GIB, free_mib=20 * GIB, available_mib=110 * GIB,
                cached_mib=88 * GIB)


def ctx(nvml: Any, args: dict[str, object] | None = None, extra: list[str] | None = None,
        **memory: Any) -> check.Context:
    vllm: dict[str, Any] = {"model": "/nonexistent", "args": args or {},
                            "extra_args": extra or []}
    return check.Context(from_dict({"vllm": vllm, "memory": memory}), env={},
                         nvml=lambda: nvml)


def lines(c: check.Context, info: MemInfo | None = SPARK,
          resident: tuple[float, float] | None = (70 * GIB, 72 * GIB)) -> dict[str, Any]:
    got = cu.check_platform(c, meminfo=lambda: info, resident=lambda _c: resident)
    return {r.name: r for r in got}


def test_discrete_h200_is_one_line() -> None:
    res = lines(ctx(FakeNvml([FakeGpu()])))
    assert list(res) == ["platform"]
    r = res["platform"]
    assert r.status == check.PASS
    assert r.detail.startswith("discrete GPU memory (nvml-memory-info: NVIDIA H200)")
    assert "start guard off" in r.detail


def test_no_driver_says_discrete_and_how_to_force() -> None:
    res = lines(ctx(FakeNvml(init_error=NVMLError_DriverNotLoaded())))
    assert "discrete" in res["platform"].detail
    assert "memory.unified = true" in res["platform"].detail


def test_spark_shows_the_memory_picture_and_the_startup_demand() -> None:
    res = lines(ctx(FakeNvml([FakeGpu(name="NVIDIA GB10", used_mib=None)]),
                    args={"gpu-memory-utilization": 0.9}))
    assert list(res) == ["platform", "unified.memory", "unified.startup-check",
                         "unified.kv-cache"]
    assert res["platform"].detail.startswith(
        "unified memory (nvml-memory-not-supported: NVIDIA GB10)")
    mem = res["unified.memory"]
    assert mem.status == check.PASS
    for text in ("MemFree 20.0 GiB", "MemAvailable 110.0 GiB", "page cache 88.0 GiB",
                 "model 70.0 of 72.0 GiB in the page cache", "guard floor 6.1 GiB"):
        assert text in mem.detail
    start = res["unified.startup-check"]
    # 0.9 x 121.6 = 109.4 GiB wanted; 20 GiB free now, ~90 GiB after evicting 70 GiB.
    assert start.status == check.WARN
    assert "want 109.4 GiB" in start.detail and "MemFree 20.0 GiB" in start.detail
    assert "about 90.0 GiB after vllmwatch evicts" in start.detail
    kv = res["unified.kv-cache"]
    assert kv.status == check.WARN and "gpu-memory-utilization is set" in kv.detail


@pytest.mark.parametrize(("args", "extra", "start", "kv"), [
    ({"gpu-memory-utilization": 0.5, "kv-cache-memory-bytes": "40G"}, [], check.PASS,
     check.PASS),
    ({}, ["--gpu-memory-utilization", "0.5", "--kv-cache-memory-bytes=40G"], check.PASS,
     check.PASS),
    ({}, [], check.WARN, check.WARN),  # the default 0.9 wants 109 GiB
    ({"gpu_memory_utilization": 0.6}, [], check.PASS, check.WARN),
    ({"gpu-memory-utilization": "lots"}, [], check.WARN, check.WARN),
])
def test_flags(args: dict[str, object], extra: list[str], start: str, kv: str) -> None:
    res = lines(ctx(FakeNvml(), args=args, extra=extra, unified=True))
    assert res["platform"].detail.startswith("unified memory (config")
    assert (res["unified.startup-check"].status, res["unified.kv-cache"].status) == (start, kv)


def test_low_memfree_warns_and_unknowns_are_said() -> None:
    low = MemInfo(121.6 * GIB, 2 * GIB, 100 * GIB, 95 * GIB)
    res = lines(ctx(FakeNvml(), unified="true"), info=low, resident=None)
    assert res["unified.memory"].status == check.WARN
    assert "model residency unknown" in res["unified.memory"].detail
    res = lines(ctx(FakeNvml(), unified="true"), info=None)
    assert res["unified.memory"].status == check.WARN


def test_guard_off_is_said() -> None:
    res = lines(ctx(FakeNvml(), unified=True, guard=False))
    assert "start guard off (memory.guard = false)" in res["platform"].detail


def test_real_model_residency_through_the_runner(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(os.urandom(2 << 20))
    (model / "model.safetensors").read_bytes()
    c = check.Context(from_dict({"vllm": {"model": str(model)}, "memory": {"unified": True}}),
                      env={"HOME": str(tmp_path)})
    got = {r.name: r for r in cu.check_platform(c)}
    assert "of 0.0 GiB in the page cache" in got["unified.memory"].detail or \
        "residency unknown" in got["unified.memory"].detail


def test_registered_in_the_checklist(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[vllm]\nmodel = "{tmp_path}"\n[memory]\nunified = true\n')
    names = [r.name for r in check.run(str(cfg), fast=True, env={"HOME": str(tmp_path)},
                                       nvml=lambda: FakeNvml())]
    assert "platform" in names and "unified.kv-cache" in names
