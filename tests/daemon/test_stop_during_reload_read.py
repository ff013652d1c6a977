"""A stop while a SIGHUP's read waits for the new vLLM interpreter's version probe (a new
venv on a cold page cache: up to vllminfo.PROBE_TIMEOUT) ends the probe with the daemon.
Before, the daemon waited for the reading worker thread at its exit until
leave_past_stuck_threads gave up 5 s later (a false daemon.threads_stuck warning), and the
probe outlived it, reparented to init."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import psutil
import pytest

from tests.support import TIMEOUT_SCALE, Daemon, base_config, free_port, merge, wait_for
from tests.support.daemon import FAKE
from vllmwatch.config import vllminfo
from vllmwatch.config.startcaches import VllmInfo


def _slow_python(tmp: Path) -> Path:
    """An interpreter that takes 600 s to start (then is this one): one process, no shim."""
    slow = tmp / "venv2" / "bin" / "python3"
    slow.parent.mkdir(parents=True)
    slow.write_text(f"#!{sys.executable}\nimport os, sys, time\ntime.sleep(600)\n"
                    f"os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])\n")
    slow.chmod(0o755)
    return slow


def _probes(slow: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if str(slow) in proc.cmdline() and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_a_stop_during_a_reloads_version_probe_ends_the_probe(tmp_path: Path) -> None:
    slow = _slow_python(tmp_path)
    cfg = base_config(free_port(), free_port())
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", cfg, env=dict(os.environ))
    try:
        d.start()
        d.wait_ready(30)
        d.write_config(merge(cfg, {"vllm": {"command": [str(slow), *FAKE[1:]]}}))
        d.signal(signal.SIGHUP)
        wait_for(lambda: _probes(slow), 30, "the version probe of the reload's read")
        d.signal(signal.SIGTERM)
        assert d.wait_exit(60 * TIMEOUT_SCALE) == 0
        assert not d.named("daemon.threads_stuck"), d.dump()
        assert not _probes(slow), "the version probe outlived the daemon"
    finally:
        d.close(check=False)
        for proc in _probes(slow):
            proc.kill()


def test_stop_probes_ends_a_probe_under_way(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # the probe's own deadline out of reach: only stop_probes can end it within the join
    monkeypatch.setattr(vllminfo, "PROBE_TIMEOUT", 3600.0)
    slow = _slow_python(tmp_path)
    got: list[VllmInfo] = []
    reader = threading.Thread(target=lambda: got.append(vllminfo._info_of(str(slow))),
                              daemon=True)
    reader.start()
    try:
        wait_for(lambda: _probes(slow), 30, "the version probe")
        vllminfo.stop_probes()
        reader.join(30 * TIMEOUT_SCALE)
        assert not reader.is_alive() and got and got[0].version is None
    finally:
        vllminfo.forget()
        for proc in _probes(slow):
            proc.kill()
