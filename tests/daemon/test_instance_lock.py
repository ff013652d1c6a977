"""One daemon per config: a second `vllmwatch run` on the same config exits at once (exit 7)
touching nothing, a killed daemon leaves no stale lock, and without a lock a tree whose
daemon is alive is still never taken for a leftover."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import psutil
import pytest

from tests.support import (
    FIRST_READY_S,
    TIMEOUT_SCALE,
    Daemon,
    base_config,
    free_port,
    http,
    merge,
    wait_for,
)
from vllmwatch.core import exitcodes

# These tests assert that the first daemon's vLLM is never touched, so its probes must not
# restart it on their own: a canary that takes over 1 s twice (two daemons, a real vLLM in
# the other lane and busy CPUs) is a hang to base_config. Nothing here is about probes.
_PATIENT = {"probe": {"timeout": "10s", "canary_timeout": "10s"}}


def _config() -> dict[str, dict[str, object]]:
    return merge(base_config(free_port(), free_port()), _PATIENT)


def _child_pid(d: Daemon) -> int:
    return int(d.wait_event("child.started", FIRST_READY_S)["pid"])


def test_a_second_daemon_on_the_same_config_exits_at_once_touching_nothing(
        tmp_path: Path) -> None:
    cfg = _config()
    first = Daemon(tmp_path, cfg).start()
    second = Daemon(tmp_path, cfg)  # the same config file: the same instance
    try:
        first.wait_ready(30)
        child = _child_pid(first)
        mark = first.mark()
        second.start()
        assert second.wait_exit(30 * TIMEOUT_SCALE) == exitcodes.ALREADY_RUNNING
        [said] = second.named("daemon.exiting")
        assert said["reason"] == "already_running" and said["holder_pid"] == first.pid
        assert said["lock"].endswith(".lock") and str(first.pid) in said["detail"]
        names = {e["event"] for e in second.events}
        assert names == {"daemon.version", "daemon.exiting"}, names  # bound, swept nothing
        # ... and said to systemd as every other exit is: STOPPING=1 and the last STATUS=,
        # which `systemctl status` keeps showing after the process is gone
        listener = second.notify
        assert listener is not None
        wait_for(lambda: listener.count("STATUS=") > 0, 5.0, "the exit's STATUS= line")
        said_to = [text for _, text in listener.lines()]
        assert any("STOPPING=1" in text for text in said_to), said_to
        status = [text for text in said_to if text.startswith("STATUS=")]
        assert status and "exiting 73: already_running" in status[-1] \
            and f"pid {first.pid}" in status[-1], status
        # The first daemon and its vLLM never noticed.
        assert psutil.Process(child).is_running()
        assert http(first.port, "/health")[0] == 200
        assert not first.named("restart.begin", mark) and not first.named("child.exited", mark)
    finally:
        first.close()  # first: the second's close kills processes carrying the marker
        second.close()


def test_a_killed_daemon_leaves_no_stale_lock(tmp_path: Path) -> None:
    cfg = _config()
    first = Daemon(tmp_path, cfg).start()
    second = Daemon(tmp_path, cfg)
    try:
        first.wait_ready(30)
        old_child = _child_pid(first)
        first.signal(signal.SIGKILL)  # its vLLM tree lives on; the kernel drops the flock
        first.wait_exit(10 * TIMEOUT_SCALE)
        second.start()
        second.wait_ready(30)
        killed = second.wait_event("leftovers.killed", 10)
        assert old_child in killed["pids"]  # the dead daemon's tree was a leftover
        assert not second.named("daemon.exiting")
    finally:
        second.close()  # second: the first's close kills processes carrying the marker
        first.close(check=False)


def test_without_a_lock_a_live_daemons_tree_is_not_a_leftover(tmp_path: Path) -> None:
    """No private state directory: no lock can be held (logged), and the second daemon still
    leaves the first one's vLLM alone (it descends from a live vllmwatch)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # not private: neither lock nor group file is trusted there
    env = {"STATE_DIRECTORY": str(shared), "RUNTIME_DIRECTORY": ""}
    cfg = _config()
    first = Daemon(tmp_path, cfg, env=env).start()
    second = Daemon(tmp_path, cfg, env=env)
    try:
        first.wait_ready(30)
        child = _child_pid(first)
        assert first.named("daemon.unlocked")
        mark = first.mark()
        second.start()
        assert second.wait_exit(30 * TIMEOUT_SCALE) == exitcodes.START  # vllm.port is the first's
        assert not second.named("leftovers.killed")
        foreign = second.wait_event("leftovers.foreign", 5)
        engines = {p.pid for p in psutil.Process(child).children(recursive=True)}
        named = {int(m) for m in re.findall(r"^pid (\d+)", "\n".join(foreign["processes"]),
                                            re.MULTILINE)}
        assert engines & named, (engines, foreign, first.dump())
        assert psutil.Process(child).is_running()
        wait_for(lambda: http(first.port, "/health")[0] == 200, 10, "the first vLLM serving")
        assert not first.named("restart.begin", mark) and not first.named("child.exited", mark)
    finally:
        first.close()
        second.close()


def test_a_spare_left_by_a_killed_daemon_is_swept_at_the_next_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A vllmwatch SIGKILLed with its spare engine up leaves that spare (its own marker, not
    the serving tree's): the next `vllmwatch run` on the config kills it before it plans or
    launches anything, and says so (spare.leftovers)."""
    from tests.support import PYTHON
    from vllmwatch.shell.sparetree import SpareCommand, SpareTree
    from vllmwatch.testing.driver import LogCapture

    d = Daemon(tmp_path, _config())
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))  # the daemon's own
    # a lifetime, not a wait: its owner kills it
    script = "import time\nprint('INFO spare', flush=True)\ntime.sleep(600)\n"
    old = SpareTree(SpareCommand([PYTHON, "-c", script], {}, str(tmp_path / "s.sock"), "m"),
                    d.marker, LogCapture(), lambda _: None, lambda: None)
    old.start()
    pid = old.pid
    assert pid is not None
    try:
        d.start()
        d.wait_ready(30)
        [said] = d.named("spare.leftovers")
        assert said["pids"] == [pid] and said["killed"] is True and not said["remaining"]
        assert old.proc is not None and old.proc.wait(10 * TIMEOUT_SCALE) == -signal.SIGKILL
        names = [e["event"] for e in d.events]
        assert names.index("spare.leftovers") < names.index("child.started")
    finally:
        d.close()
        old.stop("test ends")
        old.stops.wait()  # its waits run on a thread: wait for the end
