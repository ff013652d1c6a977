"""Container mode: `vllmwatch run` as PID 1 of a new PID namespace reaps orphaned engines.

`unshare --pid --fork --mount-proc` makes the daemon PID 1, as in a container without an init.
Killing the fake vLLM's API server with SIGKILL orphans its EngineCore onto PID 1; the daemon
must restart vLLM and leave no zombie. Root only (unshare needs CAP_SYS_ADMIN).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.support import TIMEOUT_SCALE, Daemon, base_config, free_port, wait_for, zombie


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "a new PID namespace needs root (unshare --pid)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True, text=True, timeout=30 * TIMEOUT_SCALE)
    if probe.returncode != 0:
        return f"unshare --pid fails here: {probe.stderr.strip()[:200]}"
    return None


def _pid1(d: Daemon) -> psutil.Process:
    """The daemon: unshare's child, PID 1 inside the namespace."""
    kids = wait_for(lambda: psutil.Process(d.pid).children(), 10, "unshare's child")
    return kids[0]  # type: ignore[no-any-return]


def _zombies(parent: psutil.Process) -> list[psutil.Process]:
    out = []
    for p in parent.children():
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


def _engine(api: psutil.Process) -> psutil.Process:
    def find() -> psutil.Process | None:
        return next((p for p in api.children() if "engine" in " ".join(p.cmdline())), None)

    return wait_for(find, 10, "the fake EngineCore")  # type: ignore[no-any-return]


def test_pid1_reaps_orphaned_engines_and_restarts(tmp_path: Path) -> None:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    config = base_config(free_port(), free_port())
    d = Daemon(tmp_path, config, notify=False,  # no systemd in a container: no NOTIFY_SOCKET
               argv_prefix=["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"])
    d.start()
    try:
        d.wait_ready(30)
        daemon = _pid1(d)
        api = next(p for p in daemon.children() if "fake_vllm" in " ".join(p.cmdline()))
        engine = _engine(api)
        mark = d.mark()
        api.send_signal(signal.SIGKILL)  # the engine is orphaned onto PID 1 (the daemon)
        wait_for(lambda: engine.ppid() == daemon.pid if engine.is_running() else True, 10,
                 "the engine reparented to PID 1")
        begin = d.wait_event("restart.begin", 30, mark)
        d.wait_ready(30, mark)
        # The killed API server and the swept engine are both reaped: no zombie under PID 1.
        wait_for(lambda: not _zombies(daemon), 15, "no zombie under PID 1")
        assert not zombie(engine)
        assert begin["reason"] in ("crash", "engine_died")
        assert d.named("reaper.on")
        d.wait_event("reaper.reaped", 15)  # (its line may be read after the zombie is gone)
        assert not d.named("notify.failed")  # sd_notify absent is normal in a container
        daemon.send_signal(signal.SIGTERM)
        assert d.wait_exit(60 * TIMEOUT_SCALE) == 0, d.dump()
    finally:
        d.close()
