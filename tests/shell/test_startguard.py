"""Unified memory, the shell side: platform detection through a fake NVML, the start guard
against injected /proc/meminfo readings, the prewarm step that evicts, and a real eviction
of real files measured with mincore."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support import TIMEOUT_SCALE, wait_until
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.core.unified import MemInfo, parse_meminfo
from vllmwatch.prewarm import evict, pagecache
from vllmwatch.prewarm import runner as prewarm
from vllmwatch.shell import platform
from vllmwatch.shell.startguard import GuardIO, StartGuard, make_guard
from vllmwatch.testing.driver import LogCapture
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml, NVMLError_LibraryNotFound

MIB = 1 << 20


Events = LogCapture


def config(model: str = "/nonexistent/model", **memory: Any) -> Config:
    return from_dict({"vllm": {"model": model}, "memory": memory})


def meminfo(free_gib: float, total_gib: float = 121.6, cached_gib: float = 90.0) -> str:
    kib = 1024 * 1024
    return (f"MemTotal: {int(total_gib * kib)} kB\nMemFree: {int(free_gib * kib)} kB\n"
            f"MemAvailable: {int((free_gib + cached_gib) * kib)} kB\n"
            f"Cached: {int(cached_gib * kib)} kB\n")


def wait_for(cond: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    wait_until(cond, timeout * TIMEOUT_SCALE, what)  # a loaded box is slow


# ---- platform detection ----------------------------------------------------------------------

@pytest.mark.parametrize(("gpus", "memory", "unified", "reason"), [
    ([FakeGpu(name="NVIDIA GB10", used_mib=None, total_mib=0)], {}, True,
     "nvml-memory-not-supported"),
    ([FakeGpu()], {}, False, "nvml-memory-info"),
    ([FakeGpu(), FakeGpu()], {}, False, "nvml-memory-info"),
    ([FakeGpu()], {"unified": True}, True, "config"),
    ([FakeGpu(name="NVIDIA GB10", used_mib=None)], {"unified": "false"}, False, "config"),
])
def test_detect_with_fake_nvml(gpus: list[FakeGpu], memory: dict[str, Any], unified: bool,
                               reason: str) -> None:
    log = Events()
    nvml = FakeNvml(gpus)
    got = platform.detect(config(**memory), log, nvml=nvml)
    assert (got.unified, got.reason) == (unified, reason)
    [line] = log.named("platform.detected")
    assert line["unified"] is unified and line["reason"] == reason
    assert not nvml.initialized  # detection leaves NVML as it found it


def test_detect_without_nvml_is_discrete_with_a_hint() -> None:
    log = Events()
    got = platform.detect(config(), log, nvml=FakeNvml(init_error=NVMLError_LibraryNotFound()))
    assert (got.unified, got.reason) == (False, "no-gpu")
    [line] = log.named("platform.detected")
    assert "memory.unified = true" in line["hint"] and "LibraryNotFound" in line["nvml_error"]


def test_detect_cpu_config_never_touches_nvml() -> None:
    nvml = FakeNvml([FakeGpu(name="NVIDIA GB10", used_mib=None)])
    got = platform.detect(from_dict({"vllm": {"model": "m", "gpus": []}}), None, nvml=nvml)
    assert not got.unified and nvml.calls == []


def test_read_meminfo_of_this_machine(tmp_path: Path) -> None:
    real = platform.read_meminfo()
    assert real is not None and 0 < real.free_mib <= real.total_mib
    fake = tmp_path / "meminfo"
    fake.write_text(meminfo(3.0))
    got = platform.read_meminfo(str(fake))
    assert got is not None and round(got.free_mib) == 3072
    assert platform.read_meminfo(str(tmp_path / "absent")) is None


# ---- the guard against a scripted /proc/meminfo ----------------------------------------------

class World:
    """Injected /proc/meminfo text, a clock, and recorded evictions and /proc/sys/vm writes."""

    def __init__(self, free_gib: float, writable: bool = False) -> None:
        self.text = meminfo(free_gib)
        self.now = 100.0
        self.evictions: list[int] = []
        self.writes: list[str] = []
        self.writable = writable

    def io(self) -> GuardIO:
        return GuardIO(monotonic=lambda: self.now, read_meminfo=lambda: parse_meminfo(self.text),
                       evict=self.evict, write_vm=self.write, may_write_vm=lambda: self.writable)

    def evict(self, files: Sequence[Path]) -> evict.EvictResult:
        self.evictions.append(len(files))
        return evict.EvictResult(len(files), 40 * MIB, 30 * MIB, 0)

    def write(self, path: str) -> str | None:
        self.writes.append(path)
        return None if self.writable else f"{path}: Permission denied"


FILES = [Path("/m/model-00001.safetensors"), Path("/m/model-00002.safetensors")]


def test_guard_launch_then_floor_then_gap() -> None:
    w, log = World(free_gib=50), Events()
    guard = StartGuard(FILES, config(), log, w.io())
    guard.launch()
    assert w.evictions == [2] and log.named("guard.evict")[0]["why"] == "launch"
    started = log.named("guard.started")[0]
    assert started["floor_mib"] == round(0.05 * 121.6 * 1024) and started["memfree_mib"] == 51200
    assert guard.summary.page_cache_gib() == 90.0
    assert guard.tick() == ()  # 50 GiB free: nothing
    w.text = meminfo(2.0)
    assert guard.tick() == ("evict",)
    low = log.named("guard.low_memory")[0]
    assert low["memfree_mib"] == 2048 and low["actions"] == "evict"
    w.now += 1.0
    assert guard.tick() == ()  # within memory.guard_min_gap
    w.now += 5.0
    assert guard.tick() == ("evict",)
    assert w.evictions == [2, 2, 2] and w.writes == []
    evicted = log.named("guard.evict")[-1]
    assert evicted["freed_mib"] == 30.0 and evicted["memfree_before_mib"] == 2048
    guard.stop("ready")
    stopped = log.named("guard.stopped")[0]
    assert stopped["actions"] == 3 and stopped["min_free_mib"] == 2048


def test_guard_root_actions_only_when_configured_and_permitted() -> None:
    for writable, cfg, want in [
        (True, config(guard_drop_caches=True, guard_compact=True),
         [platform.DROP_CACHES, platform.COMPACT_MEMORY]),
        (False, config(guard_drop_caches=True, guard_compact=True), []),
        (True, config(), []),
    ]:
        w, log = World(free_gib=1.0, writable=writable), Events()
        StartGuard(FILES, cfg, log, w.io()).tick()
        assert w.writes == want
        assert len(log.named("guard.drop_caches")) == (platform.DROP_CACHES in want)


def test_guard_thread_starts_and_stops(tmp_path: Path) -> None:
    w, log = World(free_gib=1.0), Events()
    guard = StartGuard(FILES, config(guard_interval=0.1, guard_min_gap=0), log, w.io())
    guard.start()
    wait_for(lambda: len(w.evictions) >= 3, what="the guard's evictions")
    assert guard.running
    guard.stop("exited")
    guard.stop("exited")  # idempotent: one guard.stopped line
    thread = guard._thread
    assert thread is not None and not guard.running
    wait_for(lambda: not thread.is_alive(), what="the guard thread to end")
    assert [e["why"] for e in log.named("guard.stopped")] == ["exited"]


def test_make_guard_is_off_on_discrete_and_when_disabled(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"x" * 4096)
    cfg = config(str(model))
    env = {"HOME": str(tmp_path)}
    assert make_guard(cfg, False, Events(), env, time.monotonic) is None
    assert make_guard(config(str(model), guard=False), True, Events(), env,
                      time.monotonic) is None
    guard = make_guard(cfg, True, Events(), env, time.monotonic)
    assert guard is not None and guard._files == [model / "model.safetensors"]
    log = Events()
    assert make_guard(config(), True, log, env, time.monotonic) is not None
    assert log.named("guard.no_files")


# ---- real files: eviction measured with mincore ----------------------------------------------

def make_model(where: Path, files: int = 3, mib: int = 4) -> list[Path]:
    where.mkdir()
    paths = []
    for i in range(files):
        p = where / f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        p.write_bytes(os.urandom(mib * MIB))
        paths.append(p)
    return paths


def test_real_eviction_measured_with_mincore(tmp_path: Path) -> None:
    paths = make_model(tmp_path / "model")
    for p in paths:
        p.read_bytes()  # into the page cache
    before = evict.resident_bytes(paths)
    if before is None:
        pytest.skip("mincore is not available here")
    if before < 6 * MIB:
        pytest.skip(f"the page cache kept only {before / MIB:.1f} MiB of 12 MiB just read "
                    "(memory pressure on this machine)")
    res = evict.evict_measured(paths)
    assert res.files == 3 and res.total_bytes == 12 * MIB
    assert res.before_bytes is not None and res.before_bytes >= 6 * MIB
    assert res.after_bytes is not None and res.after_bytes <= 1 * MIB
    assert res.freed_bytes is not None and res.freed_bytes >= 5 * MIB
    fields = res.fields()
    assert fields["total_mib"] == 12.0 and fields["freed_mib"] >= 5.0  # type: ignore[operator]


def test_prewarm_evicts_instead_of_warming_on_unified_memory(tmp_path: Path) -> None:
    paths = make_model(tmp_path / "model", files=2, mib=2)
    for p in paths:
        p.read_bytes()
    cfg = from_dict({"vllm": {"model": str(tmp_path / "model"), "gpus": []},
                     "prewarm": {"cache_dir": str(tmp_path / "cache"), "kernels": False}})
    log = Events()
    report = prewarm.run(cfg, log, {"HOME": str(tmp_path)},
                         prewarm.Hooks(unified=lambda c: True))
    step = {s.name: s for s in report.steps}["page_cache"]
    assert step.status == "ok" and step.detail.startswith("unified memory: evicted")
    assert step.data["unified"] is True and "read_bytes" not in step.data
    assert log.named("prewarm.page_cache.evicted")
    residency = pagecache.residency(paths)
    assert residency is None or residency < 0.2
    # On discrete memory the same step warms.
    report = prewarm.run(cfg, log, {"HOME": str(tmp_path)},
                         prewarm.Hooks(unified=lambda c: False))
    step = {s.name: s for s in report.steps}["page_cache"]
    assert "unified" not in step.data


def test_meminfo_reading_type() -> None:
    got = parse_meminfo(meminfo(3.0))
    assert isinstance(got, MemInfo) and round(got.available_mib) == 93 * 1024
