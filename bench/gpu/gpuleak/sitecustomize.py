"""Bench-only GPU leak injector for a real vLLM (bench/gpu/phases_gpu.py, phase `faults`).

Loaded into every Python of the vLLM tree through PYTHONPATH ([vllm.env]); acts only in the
process whose title becomes VLLM::EngineCore (or VLLMWATCH_GPU_LEAK_TITLE). When the file
named by VLLMWATCH_GPU_LEAK_TRIGGER appears, that process deletes it and allocates
VLLMWATCH_GPU_LEAK_MIB MiB of CUDA memory every second, VLLMWATCH_GPU_LEAK_STEPS times, and
never frees it: a GPU leak inside the engine, as NVML sees it. VLLMWATCH_GPU_LEAK_DEVICE
(default "cuda") names the device: this thread does not inherit the device a TP worker set
for its own thread, so a Worker_TP1 leak on its GPU needs "cuda:1".
"""

import os
import sys
import threading
import time

_TRIGGER = os.environ.get("VLLMWATCH_GPU_LEAK_TRIGGER", "")
_TITLE = os.environ.get("VLLMWATCH_GPU_LEAK_TITLE", "VLLM::EngineCore")
_DEVICE = os.environ.get("VLLMWATCH_GPU_LEAK_DEVICE", "cuda")
_HELD: list[object] = []


def _title() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            return fh.read().split(b"\0")[0].decode("utf-8", "replace")
    except OSError:
        return ""


def _watch() -> None:
    for _ in range(7200):  # bounded: 1 h at 0.5 s
        time.sleep(0.5)
        if not _title().startswith(_TITLE) or not os.path.exists(_TRIGGER):
            continue
        try:
            os.unlink(_TRIGGER)
        except OSError:
            continue
        import torch

        mib = int(os.environ.get("VLLMWATCH_GPU_LEAK_MIB", "1024"))
        for i in range(int(os.environ.get("VLLMWATCH_GPU_LEAK_STEPS", "8"))):
            _HELD.append(torch.ones(mib << 20, dtype=torch.uint8, device=_DEVICE))
            print(f"[gpuleak] pid {os.getpid()} leaked {(i + 1) * mib} MiB on {_DEVICE}",
                  file=sys.stderr, flush=True)
            time.sleep(1)
        return


def _start() -> None:
    threading.Thread(target=_watch, name="bench-gpu-leak", daemon=True).start()


if _TRIGGER:
    _start()
    # A forked EngineCore (VLLM_WORKER_MULTIPROC_METHOD=fork, issue 28) inherits no thread.
    os.register_at_fork(after_in_child=_start)
