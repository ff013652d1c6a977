"""A reload that moves vllm.port onto a port another process holds is refused: the running
config kept, the same vLLM serving (revB, 2026-12-05). Taken, it drained and stopped the
healthy vLLM, then the launch met the holder: exit 69 (port_busy), which systemd restarts
into the same 69 until its start limit. `check --config-only` (the units' first
ExecReload=) refuses it too, naming the holder."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.support import TIMEOUT_SCALE, Daemon, base_config, free_port, merge


def _config_only(path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STATE_DIRECTORY"}
    return subprocess.run([sys.executable, "-m", "vllmwatch", "check", "--config-only",
                           "--config", str(path)], capture_output=True, text=True, env=env,
                          timeout=120 * TIMEOUT_SCALE)


def test_a_reload_onto_a_held_port_keeps_the_running_config(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    busy = holder.getsockname()[1]
    cfg = base_config(free_port(), free_port())
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", cfg, env=dict(os.environ))
    try:
        d.start()
        d.wait_ready(30)
        pid = d.named("child.started")[-1]["pid"]
        path = next((tmp_path / "d").rglob("*.toml"))
        # The running config's own addresses, held by this instance's vllmwatch and vLLM, pass
        # (a shell's check: not the daemon's STATE_DIRECTORY, so not its instance lock)
        chk = _config_only(path)
        assert chk.returncode == 0, chk.stdout + chk.stderr
        d.write_config(merge(cfg, {"vllm": {"port": busy}}))
        chk = _config_only(path)
        assert chk.returncode == 78, chk.stdout + chk.stderr
        assert f"127.0.0.1:{busy} is in use by pid {os.getpid()}" in chk.stdout, chk.stdout
        mark = d.mark()
        d.signal(signal.SIGHUP)
        failed = d.wait_event("config.reload_failed", 30, mark)
        error = str(failed.get("error"))
        assert "vllm.port" in error and f"pid {os.getpid()}" in error, failed
        assert not d.named("config.reloaded", mark) and not d.named("restart.begin", mark)
        # the same vLLM still serves, on the running config's port
        assert d.running() and not d.named("daemon.exiting", mark), d.dump()
        assert not d.named("child.started", mark) and d.named("child.started")[-1]["pid"] == pid
        assert d.http_get("/readyz")[0] == 200
    finally:
        d.close(check=False)
        holder.close()
