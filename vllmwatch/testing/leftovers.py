"""What of a daemon's tree is left after it exited: live processes with its instance marker
(the serving tree's, or the spare engine's `<marker>:spare`), or a vLLM/fake_vllm command line
with its port (a process that lost the marker)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import psutil

from vllmwatch.shell.child import MARKER
from vllmwatch.testing.waiting import TIMEOUT_SCALE, holds_within


def leftovers(marker: str, port: int) -> list[psutil.Process]:
    """Live processes (zombies aside) that are the daemon's by marker or by port."""
    return [p for p in psutil.process_iter() if p.pid != os.getpid()
            and _ours(p, marker, port)]


def _ours(proc: psutil.Process, marker: str, port: int) -> bool:
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False  # dead; only waits for its parent (or PID 1) to reap it
        cmd = proc.cmdline()
        with contextlib.suppress(psutil.AccessDenied):
            # The spare engine's tree carries `<marker>:spare` (shell/sparetree.marker_of).
            if proc.environ().get(MARKER, "").partition(":")[0] == marker:
                return True
        return any("VLLM::" in a or "fake_vllm" in a for a in cmd) and str(port) in cmd
    except psutil.Error:
        return False


def zombie(proc: psutil.Process | int) -> bool:
    """A zombie now; False for a process already gone. One read of /proc: a check of
    pid_exists and then of status races a reaper that runs between the two reads."""
    try:
        return (proc if isinstance(proc, psutil.Process) else psutil.Process(proc)
                ).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def dead(proc: psutil.Process | int) -> bool:
    """Exited or a zombie waiting for its reaper (it holds neither memory nor a port)."""
    try:
        return (proc if isinstance(proc, psutil.Process) else psutil.Process(proc)
                ).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_for_gone(get: Callable[[], list[psutil.Process]], timeout: float
                  ) -> list[psutil.Process]:
    """Poll get() until it is empty or timeout (scaled by TIMEOUT_SCALE: a loaded machine
    takes longer to reap); return what is still there."""
    holds_within(lambda: not get(), timeout * TIMEOUT_SCALE)
    return get()


def wait_for_value(pred: Callable[[], bool], timeout: float) -> bool:
    """Poll pred() until True or timeout (scaled by TIMEOUT_SCALE); return whether it held."""
    return holds_within(pred, timeout * TIMEOUT_SCALE)
