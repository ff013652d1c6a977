"""What the standby phases (phases/standby2.py, issue 27) look at: the standby in /status, how
vLLM started its TP workers (fork or spawn), NVML per GPU over time, and the standby's host
memory. Reads only; nothing here signals a process.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from bench.gpu.daemon import GpuDaemon
from bench.gpu.procs import cmdline, descendants
from vllmwatch.shell import kin

FORK_VARIABLE = "VLLM_WORKER_MULTIPROC_METHOD"
STANDBY_WAIT = 120.0  # the standby's imports took ~19 s on the H200 (issue 28)
# vLLM 0.26's _maybe_force_spawn (vllm/utils): "We must use the `spawn` multiprocessing start
# method. Overriding VLLM_WORKER_MULTIPROC_METHOD to 'spawn'. ..." when CUDA is initialized
# (or in a Ray actor, or with --numa-bind) in the process that starts the workers.
SPAWN_WORDS = ("multiprocessing start method", FORK_VARIABLE)
STANDBY_KEYS = ("launch", "launches", "standby_state", "standby_pid", "standby_rss_mib",
                "standby_reason")


def standby_view(d: GpuDaemon, wait: bool = True) -> dict[str, Any]:
    """/status's standby fields; with wait, (bounded) until its imports are done or it is off
    for a reason (None everywhere: this vllmwatch has no standby)."""
    t0 = time.monotonic()
    limit = 30.0 if d.run.dry else STANDBY_WAIT  # the fake's standby imports in seconds
    end = t0 + (min(limit, max(5.0, d.run.left() - 60)) if wait else 0.0)
    while True:
        st = d.status()
        state = st.get("standby_state")
        # "off" with no reason: READY was just published and the standby not started yet.
        done = state in ("waiting", None) or (state == "off" and st.get("standby_reason"))
        if not wait or done or time.monotonic() >= end:
            break
        time.sleep(0.5)
    return {**{k: st.get(k) for k in STANDBY_KEYS}, "waited_s": round(time.monotonic() - t0, 1)}


def memory_layout(pid: int) -> tuple[int, int, int] | None:
    """(start_brk, arg_start, env_start) from /proc/PID/stat: a forked child keeps its
    parent's (the address space is a copy); an exec'd (spawned) one gets new random ones.
    None when unreadable (0s without ptrace access)."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        got = (int(rest[44]), int(rest[45]), int(rest[47]))  # fields 47, 48, 50 of proc(5)
    except (OSError, IndexError, ValueError):
        return None
    return got if any(got) else None


def _env(pid: int) -> str | None:
    try:
        return psutil.Process(pid).environ().get(FORK_VARIABLE)
    except psutil.Error:
        return None


def worker_start(d: GpuDaemon) -> dict[str, Any]:
    """How the TP workers were started: per worker its parent, whether its memory layout is
    its parent's (fork) or new (spawn: an exec), the variable in its and EngineCore's
    environment (at their exec; a fork shows its parent's), and vLLM's own lines about it."""
    workers = []
    for pid in descendants(d.pid):
        name = cmdline(pid)
        if "VLLM::Worker" not in name:
            continue
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(pid).ppid()
            mine, theirs = memory_layout(pid), memory_layout(parent)
            workers.append({"pid": pid, "title": _short(name), "parent": parent,
                            "parent_title": _short(cmdline(parent)),
                            "method": None if mine is None or theirs is None
                            else ("fork" if mine == theirs else "spawn"),
                            "env": _env(pid), "parent_env": _env(parent)})
    lines = [str(e.get("text", ""))[-240:] for e in d.named("child.line")
             if any(w in str(e.get("text", "")) for w in SPAWN_WORDS)]
    methods = sorted({str(w["method"]) for w in workers})
    return {"workers": workers, "methods": methods, "vllm_lines": lines[:6],
            "forced_spawn": any("Overriding" in ln for ln in lines)}


def _short(name: str) -> str:
    """vLLM's title (the fake carries it as its last argument), else the command's start."""
    return name[name.index("VLLM::"):][:40] if "VLLM::" in name else name[:60]


def host_memory(pid: int | None) -> dict[str, Any]:
    """A process's host memory (MiB): RSS, and PSS/USS where readable."""
    if pid is None:
        return {"pid": None}
    try:
        p = psutil.Process(pid)
        full = p.memory_full_info()
        return {"pid": pid, "rss_mib": round(full.rss / 2**20, 1),
                "pss_mib": round(getattr(full, "pss", 0) / 2**20, 1),
                "uss_mib": round(full.uss / 2**20, 1)}
    except psutil.Error as exc:
        return {"pid": pid, "error": type(exc).__name__}


def alive(pid: int | None, created: float | None) -> bool:
    """The same process (pid and start time) still exists, and is not a zombie."""
    if pid is None:
        return False
    try:
        p = psutil.Process(pid)
        return (created is None or kin.started(pid) == created) and \
            p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def created(pid: int | None) -> float | None:
    """Its start in seconds since boot (shell/kin.py): a wall-clock step never moves it."""
    return None if pid is None else kin.started(pid)


Sample = tuple[float, list[int], list[tuple[int, int]]]  # (t, used MiB per GPU, (gpu, pid))


@contextmanager
def per_gpu(d: GpuDaemon, every: float = 0.25) -> Iterator[list[Sample]]:
    """NVML per GPU every `every` s while inside, as (seconds since d's start, used MiB per
    GPU, (gpu, pid) listed); on change only."""
    nv, out, stop = d.run.nv, [], threading.Event()

    def sample() -> None:
        last: tuple[Any, ...] | None = None
        while not stop.is_set():
            used = nv.used_by_gpu()
            procs = [(g, pid) for g in range(len(used)) for pid, _ in nv.procs(g)]
            key = (tuple(u // 256 for u in used), tuple(procs))
            if key != last:
                out.append((d.now(), used, procs))
                last = key
            time.sleep(every)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        yield out
    finally:
        stop.set()
        th.join(3)


def at_launch(samples: list[Sample], t_launch: float, old_pids: set[int],
              idle: list[int], tolerance_mib: int = 1024) -> dict[str, Any]:
    """What NVML said on each GPU just before the new child started: every GPU back within
    tolerance of its idle level, and no process of the old tree listed."""
    before = [s for s in samples if s[0] <= t_launch]
    if not before:
        return {"released_all_gpus": None, "why": "no NVML sample before the launch"}
    t, used, procs = before[-1]
    listed = sorted({(g, pid) for g, pid in procs if pid in old_pids})
    over = [i for i, u in enumerate(used) if u > (idle[i] if i < len(idle) else 0) +
            tolerance_mib]
    return {"released_all_gpus": not listed and not over, "sample_t": round(t, 2),
            "used_by_gpu_mib": used, "idle_by_gpu_mib": idle, "old_listed": listed,
            "gpus_over_idle": over}
