"""What the tree starts, the tree stops: a vLLM descendant that calls setsid and clears its
environment (no marker) is found and killed at each child stop, and logged; a process of ours
that is no child's (the standby) is exempt by its pid."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import (
    PYTHON,
    REPO,
    TIMEOUT_SCALE,
    Daemon,
    base_config,
    dead,
    free_port,
    wait_for,
)
from tests.support.procs import environ
from vllmwatch.shell import reaper
from vllmwatch.shell.child import MARKER
from vllmwatch.testing.fake_vllm import ORPHAN_TAG

ORPHAN_FLAGS = ["--spawn-setsid-orphan", "--setsid-orphan-holds-port"]


def _orphans(port: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        with_tag = False
        try:
            cmd = proc.cmdline()
            with_tag = ORPHAN_TAG in cmd and str(port) in cmd
        except psutil.Error:
            continue
        if with_tag:
            found.append(proc)
    return found


def _the_orphan(d: Daemon, child: int) -> psutil.Process:
    got = wait_for(lambda: _orphans(d.port), 10, "the setsid'd descendant")
    [orphan] = got
    assert os.getsid(orphan.pid) != os.getsid(child)  # out of the child's session
    assert MARKER not in environ(orphan.pid)  # and without our marker
    return orphan


@pytest.fixture
def daemon(tmp_path: Path) -> Any:
    d = Daemon(tmp_path, base_config(free_port(), free_port(), ORPHAN_FLAGS))
    try:
        yield d
    finally:
        try:
            d.close()
        finally:
            for left in _orphans(d.port):  # never leak one into the next test
                left.kill()


def test_a_setsid_descendant_holding_the_port_is_killed_at_a_restart(daemon: Daemon) -> None:
    d = daemon.start()
    d.wait_ready(30)
    child = int(d.named("child.started")[-1]["pid"])
    orphan = _the_orphan(d, child)
    mark = d.mark()
    d.signal(signal.SIGUSR1)
    killed = d.wait_event("leftovers.killed", 20, mark)
    assert orphan.pid in killed["pids"]
    assert any(p.startswith(f"pid {orphan.pid} ") and ORPHAN_TAG in p
               for p in killed["processes"]), killed
    d.wait_ready(30, since=mark)  # the port was freed: no "foreign process" exit 4
    assert not d.named("port.busy") and dead(orphan)
    # Reaped by the reaper's killed-by-the-sweep path, not left a zombie until its grace (a
    # setsid'd orphan looks like a child some Popen of ours waits for): within the grace of
    # the restart's start, which the grace path cannot be.
    reaped = d.wait_event("reaper.reaped", 20, mark, pid=orphan.pid)
    begin = d.named("restart.begin", mark)[0]  # before the kill, so before it was a zombie
    assert d.at(reaped) - d.at(begin) < reaper.GRACE_S  # arrival times: monotonic


def test_a_setsid_descendant_is_killed_at_the_stop(daemon: Daemon) -> None:
    d = daemon.start()
    d.wait_ready(30)
    orphan = _the_orphan(d, int(d.named("child.started")[-1]["pid"]))
    mark = d.mark()
    d.signal(signal.SIGTERM)
    assert d.wait_exit(30 * TIMEOUT_SCALE) == 0
    assert orphan.pid in d.wait_event("leftovers.killed", 5, mark)["pids"]
    assert dead(orphan)


# A subreaper that starts what a daemon would: a process of ours that is no child's (marker,
# exempt by pid: the standby), and an orphan that called setsid and cleared its environment
# (adopted by us when its parent exited). Then it sweeps as RealEffects does, twice: with the
# exempt pid, and without it (the control: the marker alone would have taken it).
_SUBREAPER = textwrap.dedent("""
    import json, os, subprocess, sys
    from vllmwatch.shell import child, reaper
    from vllmwatch.testing.waiting import wait_for
    assert reaper.become_subreaper()
    marker, port = sys.argv[1], int(sys.argv[2])
    # a lifetime, not a wait: its owner kills it (past every wait here: the standby must
    # still be alive after the first sweep)
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    standby = subprocess.Popen(sleeper + ["standby"], env={**os.environ, child.MARKER: marker},
                               start_new_session=True, stdout=subprocess.DEVNULL)
    parent = subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys; p = subprocess.Popen(sys.argv[1:], env={}, "
        "start_new_session=True, stdout=subprocess.DEVNULL); print(p.pid)"]
        + sleeper + ["orphan"],
        stdout=subprocess.PIPE, text=True)
    orphan = int(parent.communicate()[0])
    wait_for(lambda: reaper.parse_stat(open(f"/proc/{orphan}/stat").read())[3]
             == os.getpid(), 10, "the orphan to be adopted")
    first = child.sweep(None, marker, "127.0.0.1", port, grace=3,
                        exempt=frozenset({standby.pid}), adopt=True)
    standby_alive = standby.poll() is None
    second = child.sweep(None, marker, "127.0.0.1", port, grace=3, adopt=True)
    print(json.dumps({"orphan": orphan, "standby": standby.pid, "first": first.killed,
                      "what": first.killed_what, "standby_alive": standby_alive,
                      "second": second.killed}))
""")


def test_an_exempt_pid_survives_the_sweep_and_a_setsid_orphan_does_not(tmp_path: Path
                                                                        ) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "STATE_DIRECTORY": str(tmp_path)}
    marker = f"test{os.getpid()}"
    proc = subprocess.Popen([PYTHON, "-c", _SUBREAPER, marker, str(free_port())], env=env,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=60 * TIMEOUT_SCALE)  # three fresh interpreters
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10 * TIMEOUT_SCALE)
    assert proc.returncode == 0, out
    got = json.loads(out.strip().splitlines()[-1])
    assert got["orphan"] in got["first"] and got["standby"] not in got["first"]
    assert got["standby_alive"]
    assert any(w.startswith(f"pid {got['orphan']} ") for w in got["what"])
    assert got["standby"] in got["second"]  # without the exempt pid the marker takes it


def _members(tmp_path: Path, marker: str) -> set[int]:
    """The pids the daemon's group file records as seen in its tree (shell/groupfile.py)."""
    try:
        text = (tmp_path / "state" / f"vllmwatch-{marker}.pgid").read_text()
    except FileNotFoundError:
        return set()
    return {int(pid) for pid, _ in json.loads(text).get("members", ())}


def test_a_setsid_descendant_left_by_a_killed_daemon_is_killed_at_the_next_start(
        tmp_path: Path) -> None:
    """Outside systemd (no cgroup to kill) a vllmwatch SIGKILLed mid-restart, its vLLM's
    group already stopped, leaves the setsid'd descendant holding vllm.port, reparented to
    init: out of the group, the session and the marker. The next daemon knows it by the
    record of its tree's members (pid and start time since boot) and kills it, saying why
    it is provably ours; it used to exit 69 (port.busy) and leave it to the operator."""
    cfg = base_config(free_port(), free_port(), ORPHAN_FLAGS)
    cfg["memory"] = {"sample_interval": "0.5s"}
    first, second = Daemon(tmp_path, cfg), Daemon(tmp_path, cfg)
    orphan: psutil.Process | None = None
    try:
        first.start()
        first.wait_ready(30)
        child = int(first.named("child.started")[-1]["pid"])
        orphan = _the_orphan(first, child)
        wait_for(lambda: orphan is not None and orphan.pid in _members(tmp_path, first.marker),
                 20, "a memory sample to record the descendant")
        first.signal(signal.SIGKILL)
        first.wait_exit(10 * TIMEOUT_SCALE)
        os.killpg(child, signal.SIGKILL)  # what the restart had done when it was killed
        wait_for(lambda: dead(child), 10, "the old vLLM's group to be gone")
        assert not dead(orphan)
        second.start()
        second.wait_ready(30)
        [said] = second.named("leftovers.recognised")
        assert said["process"].startswith(f"pid {orphan.pid} ") and "start" in said["why"]
        assert orphan.pid in second.named("leftovers.killed")[0]["pids"]
        assert not second.named("port.busy") and dead(orphan)
    finally:
        try:
            if orphan is not None and not dead(orphan):  # first: close() asserts a free port
                orphan.kill()
        finally:
            second.close()
            first.close(check=False)


def test_a_recorded_pid_now_another_process_is_left_alone(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """The record proves a process ours only while it is the very process seen: the same
    pid with another start time (a reused pid), or a record of another boot, takes nothing."""
    from vllmwatch.shell import groupfile, kin

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    os.chmod(tmp_path, 0o700)
    marker = f"test{os.getpid()}"
    sleeper = [PYTHON, "-c", "import time; time.sleep(60)"]
    leader = subprocess.Popen(sleeper, start_new_session=True)
    other = subprocess.Popen(sleeper, start_new_session=True)
    try:
        groupfile.remember(marker, leader.pid)
        groupfile.remember_members(marker, leader.pid, [leader.pid, other.pid])
        assert set(groupfile.recorded_members(marker)) == {other.pid}
        got = groupfile.read(marker)
        assert got is not None
        path = groupfile.path_of(marker)
        assert path is not None
        at = kin.started(other.pid)
        assert at is not None
        for members, boot in (([[other.pid, at - 1.0]], got.boot_id), ([[other.pid, at]], "x")):
            data = json.loads(Path(path).read_text())
            Path(path).write_text(json.dumps({**data, "members": members, "boot_id": boot}))
            assert groupfile.recorded_members(marker) == {}
        # A record whose group is another tree's is not added to (a sample of an old run).
        groupfile.remember(marker, leader.pid)
        groupfile.remember_members(marker, other.pid, [other.pid])
        assert groupfile.recorded_members(marker) == {}
    finally:
        for proc in (leader, other):
            proc.kill()
            proc.wait(10 * TIMEOUT_SCALE)


def test_the_record_names_only_what_no_other_rule_took(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The record is the last rule: a setsid'd descendant whose parent still runs in the tree
    is taken by descent, and a sweep of that live tree never calls it a leftover recognised
    (a false lead in a plain restart's log); a recorded process nothing else reaches is
    named, and its own descendants go with it."""
    from vllmwatch.shell import child, groupfile

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    os.chmod(tmp_path, 0o700)
    marker = f"test{os.getpid()}"
    # lifetimes, not waits: the finally kills their groups (past the scaled waits below: the
    # tree must be whole when it is found)
    sleeper = [PYTHON, "-c", "import time; time.sleep(600)"]
    spawn = ("import subprocess, sys, time; subprocess.Popen(sys.argv[1:], env={}, "
             "start_new_session=True); time.sleep(600)")
    leader = subprocess.Popen([PYTHON, "-c", spawn, *sleeper], start_new_session=True)
    detached = subprocess.Popen([PYTHON, "-c", spawn, *sleeper], env={},
                                start_new_session=True)
    groups = [leader.pid, detached.pid]
    try:
        inner = wait_for(lambda: psutil.Process(leader.pid).children(), 10,
                         "the leader's setsid'd child")[0]
        below = wait_for(lambda: psutil.Process(detached.pid).children(), 10,
                         "the detached process's child")[0]
        groups += [inner.pid, below.pid]
        groupfile.remember(marker, leader.pid)
        groupfile.remember_members(marker, leader.pid, [inner.pid, detached.pid])
        said: list[dict[str, Any]] = []
        ours, _ = child.find_tree(leader.pid, marker,
                                  lambda level, event, **kv: said.append({"event": event, **kv}))
        assert {p.pid for p in ours} >= {leader.pid, inner.pid, detached.pid, below.pid}
        named = [s["process"] for s in said if s["event"] == "leftovers.recognised"]
        assert len(named) == 1 and named[0].startswith(f"pid {detached.pid} "), said
    finally:
        for pid in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        for proc in (leader, detached):
            proc.wait(10 * TIMEOUT_SCALE)
