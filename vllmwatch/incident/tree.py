"""The processes of the child's tree as a record shows them: pid, role, state, memory.

vLLM never leaves the session we start it in (setsid) and keeps the API server's process
group, so the group (or session) finds every process, even ones orphaned by an API server
that was killed.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import psutil

from vllmwatch.config.redact import REDACT

_MIB = 1024 * 1024


@dataclass(frozen=True)
class Proc:
    """One live process of the tree."""

    pid: int
    ppid: int
    role: str  # api_server | engine_core | worker | other
    title: str  # the process title / command line (redacted by the record)
    state: str  # R S D T t Z (from /proc)
    rss_mib: float
    threads: int


def role_of(title: str, is_leader: bool) -> str:
    """What a vLLM process is, from its title (VLLM::EngineCore, VLLM::Worker_TP0, ...)."""
    if "EngineCore" in title:
        return "engine_core"
    if "VLLM::Worker" in title or "VllmWorker" in title:
        return "worker"
    if "APIServer" in title or is_leader:
        return "api_server"
    return "other"


def processes(pgid: int | None) -> list[Proc]:
    """The live processes in the child's group or session, leader first."""
    if pgid is None:
        return []
    out = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) != pgid and os.getsid(proc.pid) != pgid:
                continue
            with proc.oneshot():
                title = " ".join(proc.cmdline()) or proc.name()
                state = _state(proc.pid)
                out.append(Proc(proc.pid, proc.ppid(), role_of(title, proc.pid == pgid),
                                REDACT.head(title, 400), state,
                                round(proc.memory_info().rss / _MIB, 1), proc.num_threads()))
        except (psutil.Error, OSError):
            continue
    return sorted(out, key=lambda p: (p.pid != pgid, p.pid))


def _state(pid: int) -> str:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as fh:
        return fh.read().rpartition(")")[2].split()[0]
    return ""
