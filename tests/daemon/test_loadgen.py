"""bench/gpu/loadgen.py, the load behind docs/GPU.md's shape comparison, against two fake
vLLMs: round robin, redispatch when a backend dies, and the numbers summary()/outage() make."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import TIMEOUT_SCALE, free_port, owned, wait_for

ROOT = Path(__file__).resolve().parents[2]


def _loadgen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("loadgen", ROOT / "bench/gpu/loadgen.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["loadgen"] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


LG = _loadgen()


def answers(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def backends() -> Iterator[tuple[list[int], list[subprocess.Popen[bytes]]]]:
    ports = [free_port(), free_port()]
    with contextlib.ExitStack() as stack:  # each fake's whole group (its engine too) dies
        procs = [stack.enter_context(owned(
            [sys.executable, "-m", "vllmwatch.testing.fake_vllm", "--model", "m",
             "--served-model-name", "tiny", "--port", str(p), "--startup-seconds", "0",
             "--stream-interval", "0.02", "--disable-uvicorn-access-log"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)) for p in ports]
        wait_for(lambda: all(answers(p) for p in ports), 30, "fake vLLMs listening")
        yield ports, procs


def test_round_robin_then_redispatch_when_one_backend_dies(
        backends: tuple[list[int], list[subprocess.Popen[bytes]]]) -> None:
    ports, procs = backends
    load = LG.Load(ports, "tiny", concurrency=6, max_tokens=10).start()
    t0 = time.monotonic()
    wait_for(lambda: sum(r.ok for r in load.recs) >= 40, 30, "40 completions")
    t_kill = time.monotonic()
    procs[0].kill()  # mid-stream for some clients (its orphaned engine dies at teardown)
    wait_for(lambda: sum(r.ok and r.end > t_kill + 1 for r in load.recs) >= 40, 30,
               "40 completions after the kill")
    t_end = time.monotonic()
    recs = load.stop()

    before = LG.summary(recs, t0, t_kill)
    assert before["requests_failed"] == 0
    assert set(before["ok_per_backend"]) == {"0", "1"}  # both backends took requests
    assert abs(before["ok_per_backend"]["0"] - before["ok_per_backend"]["1"]) <= 6
    assert before["output_tok_per_s"] > 0 and before["tpot_ms"]["p50"] is not None
    assert all(r.tokens == 10 for r in recs if r.ok)  # ignore_eos: every token asked for

    after = LG.outage(recs, t_kill, t_end)
    # At most what was streaming from the dead backend failed (one per client at most; a
    # request cut before its first token is redispatched); refused tries went to the other.
    assert after["requests_failed"] <= 6, after
    # The class, not aiohttp's wording (a cut is ClientPayloadError, ServerDisconnectedError
    # or a reset, by where the kill lands): every failure is a stream the dead backend had
    # begun before the kill, which a client cannot redispatch without duplicating tokens.
    failed = [r for r in recs if t_kill <= r.end <= t_end and not r.ok]
    assert all(r.backend == 0 and r.first is not None and r.start < t_kill and r.error
               for r in failed), [dataclasses.asdict(r) for r in failed]
    assert after["redispatched"] > 0, after
    assert after["requests_ok"] >= 40
    # an upper bound: a loaded machine stretches it, redispatch keeps it finite
    assert after["longest_without_a_completed_request_s"] < 5.0 * TIMEOUT_SCALE
    later = [r for r in recs if r.start > t_kill + 1]
    assert later and all(r.ok for r in later)
    assert all(r.backend == 1 for r in later)


def test_summary_and_outage_of_records() -> None:
    rec = LG.Rec
    recs = [rec(0, 0.0, 1.0, first=0.1, tokens=11, status=200),
            rec(1, 0.5, 2.0, first=0.7, tokens=11, status=200),
            rec(0, 2.0, 2.5, status=None, error="ConnectionRefusedError"),
            rec(1, 2.5, 6.0, first=2.6, tokens=11, status=200, redispatched=True)]
    s = LG.summary(recs, 0.0, 10.0)
    assert (s["requests_ok"], s["requests_failed"], s["redispatched"]) == (3, 1, 1)
    assert s["output_tok_per_s"] == 3.3  # 33 tokens over the 10 s window
    assert s["ttft_s"]["p50"] == 0.1 and s["errors"] == ["ConnectionRefusedError"]
    o = LG.outage(recs, 2.0, 8.0)  # the record that ended at the fault counts as after it
    assert (o["requests_ok"], o["requests_failed"]) == (2, 1)
    assert o["longest_without_a_completed_request_s"] == 4.0  # 2.0 -> 6.0
    assert o["per_5s_ok_failed"] == {"0": [2, 1]}
    assert o["first_failure"]["error"] == "ConnectionRefusedError"
