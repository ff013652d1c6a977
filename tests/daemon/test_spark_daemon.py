"""The real daemon on a (forced) unified-memory platform, against the fake vLLM and against a
child that fails its start with vLLM's free-memory error: detection logged once, the start
guard from launch to READY, /status, and exit 5 with advice instead of a crash loop."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import PYTHON, TIMEOUT_SCALE, Daemon, free_port, wait_for
from vllmwatch.core import exitcodes

FAKE = [PYTHON, "-m", "vllmwatch.testing.fake_vllm", "--startup-seconds", "0.3"]
FREE = ("ValueError: Free memory on device cuda:0 (2.6/121.63 GiB) on startup is less than "
        "desired GPU memory utilization (0.9, 109.47 GiB). Decrease GPU memory utilization or "
        "reduce GPU memory used by other processes.")


def config(tmp_path: Path, command: list[str], **memory: Any) -> dict[str, dict[str, Any]]:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "model.safetensors").write_bytes(os.urandom(1 << 20))
    return {
        "vllm": {"command": command, "model": str(model), "port": free_port(), "gpus": []},
        "probe": {"interval": "0.5s", "timeout": "1s", "canary_interval": "1s",
                  "canary_timeout": "1s", "metrics_interval": "0.5s"},
        "restart": {"backoff_initial": "0.2s", "backoff_max": "0.5s", "stop_timeout": "3s"},
        "prewarm": {"enabled": False},
        "memory": {"unified": True, **memory},
        "status": {"listen": f"127.0.0.1:{free_port()}"},
    }


@pytest.fixture
def made(tmp_path: Path) -> Iterator[list[Daemon]]:
    daemons: list[Daemon] = []
    yield daemons
    for d in daemons:
        d.close()


def test_guard_runs_from_launch_to_ready(tmp_path: Path, made: list[Daemon]) -> None:
    d = Daemon(tmp_path, config(tmp_path, FAKE))
    made.append(d)
    d.start()
    d.wait_ready(30.0)
    [platform] = d.named("platform.detected")
    assert platform["unified"] is True and platform["reason"] == "config"
    started = d.wait_event("guard.started", 5.0)
    assert started["files"] == 1 and started["floor_mib"] >= 4096
    evict = d.wait_event("guard.evict", 5.0, why="launch")
    assert evict["total_mib"] == 1.0 and "freed_mib" in evict
    stopped = d.wait_event("guard.stopped", 5.0)
    assert stopped["why"] == "ready"
    status = json.loads(urllib.request.urlopen(
        f"http://{d.status_listen}/status", timeout=5 * TIMEOUT_SCALE).read())
    assert status["unified_memory"] is True and status["platform_reason"] == "config"
    metrics = urllib.request.urlopen(f"http://{d.status_listen}/metrics",
                                     timeout=5 * TIMEOUT_SCALE).read()
    assert b"\nvllmwatch_unified_memory 1.0\n" in metrics
    # said at the first memory sample, on its own timer: READY may come first (a loaded box)
    d.wait_event("memory.source", 30.0, source="unified")


def test_memory_failed_starts_stop_with_the_start_memory_exit(tmp_path: Path,
                                                             made: list[Daemon]) -> None:
    script = (f"import sys; print({FREE!r}); "
              "print('\\n'.join('  File \"x.py\", line %d' % i for i in range(40))); "
              "sys.exit(1)")
    d = Daemon(tmp_path, config(tmp_path, [PYTHON, "-c", script], start_memory_retries=1))
    made.append(d)
    d.start()
    assert d.wait_exit(60.0 * TIMEOUT_SCALE) == exitcodes.START_MEMORY
    failures = d.named("start.memory_failure")
    assert [f["failures_in_row"] for f in failures] == [1, 2]
    assert "page cache held" in failures[0]["detail"]
    [gave_up] = d.named("start.memory_gave_up")
    assert "kv-cache-memory-bytes" in gave_up["hint"]
    assert [b["reason"] for b in d.named("restart.begin")] == ["start_memory"]
    assert len(d.named("guard.evict", why="launch")) == 2  # evicted before each start
    wait_for(lambda: d.named("daemon.exit"), 5.0, "daemon.exit")
    assert d.named("daemon.exit")[0]["code"] == exitcodes.START_MEMORY
