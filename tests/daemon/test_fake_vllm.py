"""The fake vLLM server behaves like real vLLM where the supervisor looks (see FACTS.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from tests.support.fakevllm import completion, fake, http
from vllmwatch.testing.fake_engine import FaultClock
from vllmwatch.testing.fake_vllm import parse_args
from vllmwatch.testing.waiting import TIMEOUT_SCALE, sigstop
from vllmwatch.testing.waiting import wait_for as wait_scaled

T = TypeVar("T")
# How long an exit may take before the test calls it a hang: a deadline, not a speed target
# (a loaded CI box took more than 5 s for the fake to start and crash during its start).
HANG = 60.0


def wait_for(check: Callable[[], T], timeout: float = 5.0, what: str = "condition") -> T:
    """Poll ``check`` until it returns something truthy, or fail after ``timeout`` (scaled
    by TIMEOUT_SCALE: a loaded machine is slow, never wrong)."""
    return wait_scaled(check, timeout, what)  # type: ignore[no-any-return]


def children(pid: int) -> list[int]:
    """All descendants of ``pid``, read from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        kids = [c for c, p in parents.items() if p == parent]
        found += kids
        todo += kids
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def engine_pid(pid: int) -> int:
    return wait_for(lambda: next((c for c in children(pid) if "VLLM::EngineCore" in cmdline(c)),
                                 0), what="EngineCore")


def test_serves_like_vllm(tmp_path: Path) -> None:
    with fake(tmp_path, "--api-key", "k", "--workers", "2") as f:
        # vLLM's key guards every /v1 path, GET /v1/models too; /health stays open
        assert http(f.port, "/v1/models")[0] == 401 and http(f.port, "/health")[0] == 200
        assert json.loads(http(f.port, "/v1/models", key="k")[1])["data"][0]["id"] == "fake"
        assert completion(f.port)[0] == 401
        assert http(f.port, "/v1/completions", {"model": "nope"}, key="k")[0] == 404
        status, body = http(f.port, "/v1/completions", {"model": "fake", "prompt": "a b",
                                                        "max_tokens": 5}, key="k")
        assert status == 200
        assert json.loads(body)["usage"] == {"prompt_tokens": 2, "completion_tokens": 5,
                                             "total_tokens": 7}
        status, body = http(f.port, "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                            key="k")
        assert status == 200
        assert json.loads(body)["choices"][0]["message"]["content"] == "fake fake"
        m = f.metrics()
        assert m["vllm:generation_tokens_total"] == 7
        assert m["vllm:prompt_tokens_total"] == 3
        assert m["vllm:request_success_total:length"] == 2
        assert m["vllm:num_requests_running"] == 0
        tree = [cmdline(c) for c in children(f.proc.pid)]
        assert sum("VLLM::EngineCore" in c for c in tree) == 1
        assert sum("VLLM::Worker_TP" in c for c in tree) == 2
        assert os.getpgid(engine_pid(f.proc.pid)) == f.proc.pid  # same group, no setsid
        text = f.log.read_text()
        for milestone in ("(EngineCore pid=", "Starting to load model org/m", "Loading weights "
                          "took", "Model loading took", "torch.compile took", "Available KV "
                          "cache memory", "Capturing CUDA graphs", "Graph capturing finished",
                          "init engine (profile", "Starting vLLM server on http://127.0.0.1",
                          "Application startup complete."):
            assert milestone in text


def test_metrics_parse_with_prometheus_client(tmp_path: Path) -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    with fake(tmp_path, "--busy") as f:
        before = f.metrics()["vllm:generation_tokens_total"]
        wait_for(lambda: f.metrics()["vllm:generation_tokens_total"] > before, what="tokens")
        families = {fam.name: fam for fam in parser.text_string_to_metric_families(
            http(f.port, "/metrics")[1].decode())}
        assert families["vllm:generation_tokens"].type == "counter"
        assert families["vllm:num_requests_running"].samples[0].value > 0
        assert families["vllm:kv_cache_usage_perc"].samples[0].labels == {
            "engine": "0", "model_name": "fake"}
        reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}
        assert reasons == {"stop", "length", "abort"}


def test_hang_keeps_health_200_while_completions_time_out(tmp_path: Path) -> None:
    with fake(tmp_path, "--hang-after", "0.2") as f:
        wait_for(lambda: completion(f.port, timeout=0.5)[0] == 0, what="a hung completion")
        assert f.health() == 200
        assert http(f.port, "/v1/models")[0] == 200


def test_sigstopped_engine_hangs_completions(tmp_path: Path) -> None:
    with fake(tmp_path) as f:
        engine = engine_pid(f.proc.pid)
        sigstop(engine)
        assert completion(f.port, timeout=0.5)[0] == 0
        assert f.health() == 200
        os.kill(engine, signal.SIGCONT)
        assert completion(f.port)[0] == 200


def test_engine_death_turns_health_503_then_exits_0(tmp_path: Path) -> None:
    # The API server outlives its engine by the exit delay, answering 503 (and 500 to a
    # completion) meanwhile: both are asked before it exits, however slow the machine.
    with fake(tmp_path, "--engine-death-exit-delay", "3") as f:
        os.kill(engine_pid(f.proc.pid), signal.SIGKILL)
        wait_for(lambda: f.health() == 503, timeout=2, what="/health 503")
        assert completion(f.port)[0] == 500
        assert f.proc.poll() is None
        assert f.proc.wait(timeout=HANG) == 0
        assert "died unexpectedly" in f.log.read_text()


def test_engine_crash_after(tmp_path: Path) -> None:
    with fake(tmp_path, "--engine-crash-after", "0.1", "--engine-death-exit-delay", "0.2",
              armed=True) as f:
        assert f.proc.poll() is None  # armed by the file, not by the clock: still up
        f.arm()
        assert f.proc.wait(timeout=HANG) == 0
        assert "EngineCore encountered a fatal error." in f.log.read_text()


def test_sigterm_exits_0_and_leaves_no_children(tmp_path: Path) -> None:
    with fake(tmp_path, "--workers", "2") as f:
        tree = wait_for(lambda: [] if len(kids := children(f.proc.pid)) < 3 else kids)
        start = time.monotonic()
        f.proc.send_signal(signal.SIGTERM)
        assert f.proc.wait(timeout=HANG) == 0
        assert time.monotonic() - start < 1.0 * TIMEOUT_SCALE  # no 0.4 s SIGKILL escalations
        wait_for(lambda: not any(alive(p) for p in tree), timeout=2, what="children to exit")
        assert "Shutting down" in f.log.read_text()


def test_sigkill_of_api_server_orphans_the_engine(tmp_path: Path) -> None:
    with fake(tmp_path, "--workers", "1") as f:
        engine = engine_pid(f.proc.pid)
        f.proc.kill()
        f.proc.wait()
        assert alive(engine)
        assert f.proc.pid not in children(os.getpid())  # reaped; the engine has a new parent
        assert engine not in children(f.proc.pid)
        assert wait_for(lambda: "orphaned" in f.log.read_text(), what="orphan log line")


def test_ignore_sigterm_needs_sigkill(tmp_path: Path) -> None:
    with fake(tmp_path, "--ignore-sigterm") as f:
        os.killpg(f.proc.pid, signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            f.proc.wait(timeout=0.5)
        assert f.health() == 200


def test_exit_after_with_code(tmp_path: Path) -> None:
    with fake(tmp_path, "--exit-after", "0.1", "--exit-code", "3", armed=True) as f:
        assert f.health() == 200
        f.arm()
        assert f.proc.wait(timeout=HANG) == 3
        wait_for(lambda: not children(f.proc.pid), timeout=2, what="engine to exit")


def test_fail_start_and_crash_during_start(tmp_path: Path) -> None:
    with fake(tmp_path, "--fail-start", ready=0) as f:
        assert f.proc.wait(timeout=HANG) == 2
        assert f.proc.stderr is not None
        assert b"vllm: error:" in f.proc.stderr.read()
    with fake(tmp_path, "--crash-during-start", "0.05", ready=0) as f:
        assert f.proc.wait(timeout=HANG) == 1
        assert f.proc.stderr is not None
        assert b"Engine core initialization failed" in f.proc.stderr.read()


def test_stall_reports_requests_but_freezes_tokens(tmp_path: Path) -> None:
    with fake(tmp_path, "--stall-after", "0", "--busy") as f:
        tokens = f.metrics()["vllm:generation_tokens_total"]
        assert completion(f.port, timeout=0.3)[0] == 0
        m = wait_for(lambda: m if (m := f.metrics())["vllm:num_requests_waiting"] else {})
        assert m["vllm:num_requests_running"] > 0
        assert m["vllm:generation_tokens_total"] == tokens
        assert f.health() == 200


def test_slow_completion_is_busy_not_hung(tmp_path: Path) -> None:
    with fake(tmp_path, "--slow-completion", "0.6", "--health-fail-after", "0", ready=500) as f:
        start = time.monotonic()
        result: list[int] = []
        t = threading.Thread(target=lambda: result.append(completion(f.port, 3, max_tokens=50)[0]))
        t.start()
        wait_for(lambda: f.metrics()["vllm:generation_tokens_total"] > 0, what="progress")
        assert f.metrics()["vllm:num_requests_running"] == 1
        t.join()
        assert result == [200]
        assert time.monotonic() - start >= 0.6


def test_leak_grows_rss(tmp_path: Path) -> None:
    with fake(tmp_path, "--leak-mib-per-s", "200") as f:
        rss = f.metrics()["process_resident_memory_bytes"]
        wait_for(lambda: f.metrics()["process_resident_memory_bytes"] > rss + 50 * 2**20,
                 timeout=3, what="RSS growth")


def test_unknown_vllm_flags_are_ignored_and_key_comes_from_env(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "secret")
    a = parse_args(["serve", "--model", "m", "--port=9", "--max-model-len", "2048",
                    "--enforce-eager", "--hf-overrides", '{"a": 1}', "-tp", "2"])
    assert (a.model, a.port, a.api_key, a.workers, a.role) == ("m", 9, "secret", None, "api")


def _raw_stream(port: int) -> bytes:
    """A stream=true completion read off the socket to its close: the bytes as sent."""
    import socket

    body = json.dumps({"model": "fake", "prompt": "a b", "max_tokens": 3, "stream": True})
    with socket.create_connection(("127.0.0.1", port), timeout=30 * TIMEOUT_SCALE) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     f"application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


def test_a_stream_ends_as_vllms_does_chunked_with_done_and_the_last_chunk(
        tmp_path: Path) -> None:
    """As uvicorn sends it: chunked, [DONE], then the zero-length chunk (a client tells a whole
    stream from a cut one); http.client reads it whole."""
    import http.client

    with fake(tmp_path) as f:
        wait_for(lambda: f.health() == 200, 20, "ready")
        raw = _raw_stream(f.port)
        head, _, body = raw.partition(b"\r\n\r\n")
        assert b"Transfer-Encoding: chunked" in head and head.startswith(b"HTTP/1.1 200")
        assert body.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), body[-80:]
        conn = http.client.HTTPConnection("127.0.0.1", f.port, timeout=30 * TIMEOUT_SCALE)
        conn.request("POST", "/v1/completions", json.dumps(
            {"model": "fake", "prompt": "a", "max_tokens": 2, "stream": True}))
        data = conn.getresponse().read()  # raises IncompleteRead on a cut body
        assert data.startswith(b"data: {") and data.endswith(b"data: [DONE]\n\n")
        conn.close()


def test_a_cut_stream_is_an_injected_fault_and_reads_as_cut(tmp_path: Path) -> None:
    import http.client

    with fake(tmp_path, "--cut-stream-after", "1") as f:
        wait_for(lambda: f.health() == 200, 20, "ready")
        raw = _raw_stream(f.port)
        assert raw.count(b"data: ") == 1 and not raw.endswith(b"0\r\n\r\n"), raw[-80:]
        conn = http.client.HTTPConnection("127.0.0.1", f.port, timeout=30 * TIMEOUT_SCALE)
        conn.request("POST", "/v1/completions", json.dumps(
            {"model": "fake", "prompt": "a b", "max_tokens": 3, "stream": True}))
        with pytest.raises(http.client.IncompleteRead):
            conn.getresponse().read()
        conn.close()
        assert completion(f.port)[0] == 200, "a plain completion is not cut"


@pytest.mark.parametrize("mtime_offset", [0.0, -3600.0])
def test_the_arm_file_arms_by_a_touch_whatever_the_wall_clock_says(
        tmp_path: Path, mtime_offset: float) -> None:
    """The fake's faults are armed by a touch of --arm-file after its start. Compared as an
    mtime against the start's wall time, a wall-clock step back (CI's box had a 27 s step)
    left a touch unseen and the test waited for a fault that never came; so did a touch
    within the file system's timestamp granularity of the start."""
    arm = tmp_path / "faults.arm"
    arm.touch()  # touched before this fake started: a restarted fake stays healthy
    clock = FaultClock(str(arm))
    assert clock.age() == float("-inf")
    now = time.time() + mtime_offset  # the touch's mtime, as a clock stepped back stamps it
    os.utime(arm, (now, now))
    assert clock.age() >= 0.0
    fresh = tmp_path / "absent.arm"
    late = FaultClock(str(fresh))
    assert late.age() == float("-inf")
    fresh.touch()  # made after the start: armed
    assert late.age() >= 0.0
