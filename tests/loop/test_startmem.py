"""Starts that die for memory, through the real loop over a scripted world: the restart is
named (start_memory, with the numbers), repeats count only in consecutive generations, and
the daemon stops with exit 5 and advice instead of crash-looping."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllmwatch.config.schema import from_dict
from vllmwatch.core import exitcodes, unified
from vllmwatch.core.events import ChildExited, Tick
from vllmwatch.core.state import ChildRun, Proc, S, WatchState
from vllmwatch.status.statusline import summary
from vllmwatch.testing.driver import Driver, World, config_with

CONFIG = from_dict({
    "vllm": {"model": "/m", "gpus": []},
    "restart": {"backoff_initial": 1, "backoff_max": 2, "backoff_jitter": 0.0,
                "max_restarts": 10, "window": 3600},
    "prewarm": {"enabled": False},
    "memory": {"start_memory_retries": 2},
})
FREE = ("(EngineCore pid=77) ValueError: Free memory on device cuda:0 (2.6/121.63 GiB) on "
        "startup is less than desired GPU memory utilization (0.9, 109.47 GiB). Decrease GPU "
        "memory utilization or reduce GPU memory used by other processes.")
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
TAIL = tuple(f"  File \"engine.py\", line {i}, in run" for i in range(30))  # long traceback


def starting(d: Driver) -> bool:
    return d.state.state == S.STARTING and d.state.pid is not None


def fail_start(d: Driver, memory_lines: tuple[str, ...] = (FREE,), unified: bool = True,
               code: int = 1) -> None:
    assert d.run_until(lambda: starting(d), 60)
    pid = d.state.pid
    assert pid is not None
    d.world.child_alive = False
    d.fx.exited = ChildExited(pid, code, None, last_lines=TAIL, memory_lines=memory_lines,
                              page_cache_gib=95.2 if unified else None, unified=unified)
    d.send(Tick())


def driver() -> Driver:
    return Driver(CONFIG, world=World(canary_ok=False))  # never READY: starts only


def test_memory_failure_is_named_and_retried() -> None:
    d = driver()
    fail_start(d)
    [begin] = d.events("restart.begin")
    assert begin["reason"] == "start_memory"
    assert begin["detail"] == ("vLLM's start-up check saw 2.6 of 121.63 GiB free, wanted "
                               "109.47 GiB (gpu-memory-utilization 0.9); page cache held "
                               "95.2 GiB at start")
    [fail] = d.events("start.memory_failure")
    assert fail["cause"] == "startup_free_memory" and fail["failures_in_row"] == 1
    assert "evicting" in fail["next"]
    assert d.run_until(lambda: starting(d), 60)  # and it starts again
    assert d.exit_code is None
    assert "page cache held 95.2 GiB" in summary(d.loop.snapshot)


def test_repeated_memory_failures_stop_with_exit_5_and_advice() -> None:
    d = driver()
    for _ in range(3):
        fail_start(d)
    assert d.run_until(lambda: d.exit_code is not None, 120)
    assert d.exit_code == exitcodes.START_MEMORY
    assert d.state.state == S.FAILED
    [gave_up] = d.events("start.memory_gave_up")
    for word in ("3 times in a row", "kv-cache-memory-bytes", "gpu-memory-utilization",
                 "other tenants"):
        assert word in gave_up["hint"]
    assert [f["failures_in_row"] for f in d.events("start.memory_failure")] == [1, 2, 3]
    assert d.state.last_reason == "start_memory"
    assert d.world.spawns == 3  # no fourth launch


def test_a_different_failure_in_between_resets_the_count() -> None:
    d = driver()
    fail_start(d)
    fail_start(d)
    fail_start(d, memory_lines=())  # an ordinary crash
    fail_start(d, memory_lines=(OOM,))
    assert d.exit_code is None
    counts = [f["failures_in_row"] for f in d.events("start.memory_failure")]
    assert counts == [1, 2, 1]
    assert [b["reason"] for b in d.events("restart.begin")] == [
        "start_memory", "start_memory", "crash", "start_memory"]


@pytest.mark.parametrize(("lines", "cause"), [
    ((FREE,), "startup_free_memory"),
    ((OOM,), "profiling_oom"),
    (("RuntimeError: CUDA driver error: out of memory",), "profiling_oom"),
    (("ValueError: No available memory for the cache blocks. Try increasing "
      "`gpu_memory_utilization` when initializing the engine.",), "kv_cache_memory"),
])
def test_discrete_gpu_names_the_cause_without_page_cache(lines: tuple[str, ...],
                                                         cause: str) -> None:
    d = driver()
    fail_start(d, memory_lines=lines, unified=False)
    [fail] = d.events("start.memory_failure")
    assert fail["cause"] == cause and fail["unified"] is False
    assert "page cache" not in d.events("restart.begin")[0]["detail"]


# ---- the counting invariant, on the pure glue --------------------------------------------

@given(st.lists(st.booleans(), min_size=1, max_size=12), st.integers(1, 4))
@settings(max_examples=200, deadline=None)
def test_stop_exactly_after_retries_plus_one_memory_failures_in_a_row(
        memory: list[bool], retries: int) -> None:
    """Generations 1..n fail, each for memory or not: the verdict is "stop" exactly at the
    first generation that closes a run of retries + 1 consecutive memory failures."""
    cfg = config_with(CONFIG, memory={"start_memory_retries": retries})
    s = WatchState(config=cfg)
    run = 0
    for gen, is_memory in enumerate(memory, start=1):
        s = replace(s, child=ChildRun(gen=gen, started=0.0, vllm=cfg.vllm,
                                                proc=Proc(pid=gen)))
        ev = ChildExited(gen, 1, None, memory_lines=(OOM,) if is_memory else ())
        got = unified.start_failed(s, ev)
        run = run + 1 if is_memory else 0
        if not is_memory:
            assert got is None
            continue
        assert got is not None
        s, _, _, stop = got
        assert s.memory_failures == (run, gen)
        assert stop == (run > retries)
        if stop:
            break
