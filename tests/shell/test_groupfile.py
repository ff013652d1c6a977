"""The remembered process group is trusted only when provably ours: a forged file, wherever
the code might read one, never makes the start-up sweep kill a foreign process group."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support import TIMEOUT_SCALE, dead, free_port, owned, wait_for
from vllmwatch.config import safefile
from vllmwatch.shell import child, groupfile, kin


@pytest.fixture
def foreign() -> Iterator[psutil.Process]:
    """A vLLM-looking `sleep` in a session of its own: somebody else's process group."""
    with owned(["bash", "-c", 'exec -a "vllm serve forged" sleep 300'],
               env={"PATH": os.environ["PATH"]}) as proc:
        ps = psutil.Process(proc.pid)
        wait_for(lambda: "vllm serve" in " ".join(ps.cmdline()), 10, "the forged title")
        yield ps


@pytest.fixture
def marker(tmp_path: Path) -> str:
    return child.instance_id(str(tmp_path / "vllmwatch.toml"))


def forged(proc: psutil.Process, marker: str, started: float | None = None) -> str:
    return json.dumps({"pgid": proc.pid, "started": proc.create_time() if started is None
                       else started, "marker": marker})


def survives_sweep(proc: psutil.Process, marker: str) -> bool:
    done = child.sweep(None, marker, "127.0.0.1", free_port(), grace=0.5)
    assert proc.pid not in done.killed
    return proc.is_running() and not dead(proc)


def plant_everywhere_untrusted(tmp_path: Path, proc: psutil.Process, marker: str,
                               monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Forged files, right format and pointing at proc, in each place someone else could
    write: the old /tmp name, and world-writable $STATE_DIRECTORY / $RUNTIME_DIRECTORY."""
    name = f"vllmwatch-{marker}.pgid"
    planted = [Path("/tmp") / name]
    planted[0].write_text(forged(proc, marker))
    for var in ("STATE_DIRECTORY", "RUNTIME_DIRECTORY"):
        d = tmp_path / var.lower()
        d.mkdir()
        d.chmod(0o777)
        (d / name).write_text(forged(proc, marker))
        planted.append(d / name)
        monkeypatch.setenv(var, str(d))
    return planted


def test_forged_files_in_untrusted_places_are_ignored(
        tmp_path: Path, foreign: psutil.Process, marker: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    planted = plant_everywhere_untrusted(tmp_path, foreign, marker, monkeypatch)
    try:
        assert groupfile.state_dir() is None  # a world-writable state dir is not used
        assert child.remembered_group(marker) is None
        assert survives_sweep(foreign, marker)
    finally:
        planted[0].unlink()


def test_world_writable_file_and_symlink_are_ignored(
        tmp_path: Path, foreign: psutil.Process, marker: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv("STATE_DIRECTORY", str(state))
    path = Path(groupfile.path_of(marker) or "")
    path.write_text(forged(foreign, marker))
    path.chmod(0o666)
    assert groupfile.read(marker) is None and survives_sweep(foreign, marker)
    path.unlink(missing_ok=True)  # the sweep may have removed it: it is in our directory
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(forged(foreign, marker))
    path.symlink_to(elsewhere)
    assert groupfile.read(marker) is None and survives_sweep(foreign, marker)


def test_file_of_another_owner_is_ignored(tmp_path: Path, foreign: psutil.Process,
                                          marker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    nobody = pwd.getpwnam("nobody").pw_uid
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv("STATE_DIRECTORY", str(state))
    path = Path(groupfile.path_of(marker) or "")
    path.write_text(forged(foreign, marker))
    path.chmod(0o600)
    os.chown(path, nobody, -1)
    assert groupfile.read(marker) is None and survives_sweep(foreign, marker)
    os.chown(state, nobody, -1)  # a state directory someone else owns is not ours either
    assert groupfile.state_dir() is None


def test_trusted_file_with_a_recycled_pid_is_logged_and_left_alone(
        tmp_path: Path, foreign: psutil.Process, marker: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv("STATE_DIRECTORY", str(state))
    Path(groupfile.path_of(marker) or "").write_text(
        forged(foreign, marker, started=foreign.create_time() - 3600))
    events: list[tuple[str, str, dict[str, object]]] = []
    assert child.remembered_group(marker, lambda lvl, ev, **kw: events.append((lvl, ev, kw))) \
        is None
    assert events and events[0][1] == "child.group_unproven"
    assert "recycled" in str(events[0][2]["reason"])
    assert survives_sweep(foreign, marker)


def test_our_own_remembered_group_is_found(tmp_path: Path, foreign: psutil.Process,
                                           marker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The positive control: what we wrote ourselves, for a leader we started, is ours."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv("STATE_DIRECTORY", str(state))
    child.remember_group(marker, foreign.pid)
    path = Path(groupfile.path_of(marker) or "")
    assert path.stat().st_mode & 0o777 == 0o600
    assert child.remembered_group(marker) == foreign.pid
    ours, _ = child.find_tree(None, marker)
    assert foreign.pid in [p.pid for p in ours]
    child.remember_group(marker, None)
    assert not path.exists()


@pytest.mark.parametrize("step", [27.0, -27.0])
def test_our_group_stays_ours_across_a_wall_clock_step(
        tmp_path: Path, foreign: psutil.Process, marker: str, monkeypatch: pytest.MonkeyPatch,
        step: float) -> None:
    """The leader carries no marker (vLLM's titles can erase it): its start time alone proves
    it ours, and a wall-clock step between the write and the read must not unprove it."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv("STATE_DIRECTORY", str(state))
    child.remember_group(marker, foreign.pid)
    clock_step(monkeypatch, step)
    assert child.remembered_group(marker) == foreign.pid
    ours, _ = child.find_tree(None, marker)
    assert foreign.pid in [p.pid for p in ours]


def test_a_recycled_pid_is_told_in_the_new_format_and_after_a_reboot(
        tmp_path: Path, foreign: psutil.Process, marker: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's start since boot decides in this boot; a file of another boot falls back
    to the wall-clock start: either way, another start time is a recycled pid."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv("STATE_DIRECTORY", str(state))
    path = Path(groupfile.path_of(marker) or "")
    since = kin.started(foreign.pid)
    assert since is not None
    for boot, since_boot, wall in ((kin.boot_id(), since - 5.0, foreign.create_time()),
                                   ("another-boot", since, foreign.create_time() - 5.0)):
        path.write_text(json.dumps({"pgid": foreign.pid, "started": wall, "marker": marker,
                                    "since_boot": since_boot, "boot_id": boot}))
        path.chmod(0o600)
        got = groupfile.read(marker)
        assert got is not None and "recycled" in str(groupfile.proven(got)), boot
    assert survives_sweep(foreign, marker)


def test_private_fallback_directory_is_0700(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("STATE_DIRECTORY", "RUNTIME_DIRECTORY"):
        monkeypatch.delenv(var, raising=False)
    if os.geteuid() == 0:  # root's place by the rule, and the mode made in a folder of
        # the test's: the suite leaves nothing in the host's own /run
        assert groupfile.state_dir_candidate({}) == "/run/vllmwatch"
        old = os.umask(0)  # the mode is the code's, not the umask's
        try:
            got = safefile.private_dir(str(tmp_path / "run" / "vllmwatch"))
        finally:
            os.umask(old)
        assert got is not None and os.stat(got).st_mode & 0o777 == 0o700
        return
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    got = groupfile.state_dir()
    assert got == str(tmp_path / "vllmwatch") and os.stat(got).st_mode & 0o777 == 0o700


def test_a_marker_set_by_another_user_does_not_make_a_process_ours(marker: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as another user")
    nobody = pwd.getpwnam("nobody")
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True, user=nobody.pw_uid,
                            env={"PATH": os.environ["PATH"], child.MARKER: marker})
    try:
        ps = psutil.Process(proc.pid)
        wait_for(lambda: ps.environ().get(child.MARKER) == marker, 10, "the marker")
        assert not groupfile.carries_marker(ps, marker)
        assert proc.pid not in [p.pid for p in child.find_tree(None, marker)[0]]
    finally:
        proc.kill()
        proc.wait(timeout=10 * TIMEOUT_SCALE)


def test_forged_file_of_another_user_in_the_default_place_is_ignored(
        foreign: psutil.Process, marker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No $STATE_DIRECTORY: the fallback place, with a forged file another user owns."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    for var in ("STATE_DIRECTORY", "RUNTIME_DIRECTORY"):
        monkeypatch.delenv(var, raising=False)
    path = Path(groupfile.path_of(marker) or "")
    assert path.parent == Path("/run/vllmwatch")
    tmp_name = Path("/tmp") / path.name
    try:
        for place in (path, tmp_name):
            place.write_text(forged(foreign, marker))
            place.chmod(0o600)
            os.chown(place, pwd.getpwnam("nobody").pw_uid, -1)
        assert groupfile.read(marker) is None
        assert survives_sweep(foreign, marker)
    finally:
        path.unlink(missing_ok=True)
        tmp_name.unlink(missing_ok=True)


def clock_step(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The wall clock steps by `seconds` (NTP after a VM pause): the kernel's boot time in
    /proc/stat moves with it, and so does every psutil create_time read from now on."""
    real = psutil._psplatform.boot_time  # type: ignore[attr-defined]
    monkeypatch.setattr(psutil._psplatform, "boot_time", lambda: real() + seconds)


@pytest.mark.parametrize("title,step", [("VLLM::EngineCore", 0.0), ("sleep-not-vllm", 0.0),
                                        ("VLLM::EngineCore", -27.0)])
def test_an_engine_orphaned_by_its_dead_api_server_is_swept_at_the_next_start(
        tmp_path: Path, marker: str, monkeypatch: pytest.MonkeyPatch, title: str,
        step: float) -> None:
    """vLLM's API server died, then its vllmwatch was SIGKILLed: the remembered group has no
    leader, and the engine's title erased our marker. It still is in the group and session
    we made (Linux gives no new process a pid used as a live group's id), of our user and
    younger than the leader: swept, where before it kept its GPU memory through the next
    start. Something in that group that does not look like vLLM is left alone."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv("STATE_DIRECTORY", str(state))
    leader_sh = (f"env -i bash -c 'exec -a {title} sleep 300' & echo $!; read _")
    with owned(["bash", "-c", leader_sh], env={"PATH": os.environ["PATH"],
                                               child.MARKER: marker},
               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as leader:
        assert leader.stdout is not None and leader.stdin is not None
        engine = psutil.Process(int(leader.stdout.readline()))
        # its title as argv[0], after the last exec: before it, `env` still carried our
        # marker, and a loaded CI run swept that `env` as ours
        wait_for(lambda: engine.cmdline()[:1] == [title], 10, "the engine's title")
        child.remember_group(marker, leader.pid)  # what the killed vllmwatch had written
        clock_step(monkeypatch, step)  # "younger than the leader" in a clock no step moves
        leader.stdin.close()  # the API server exits; the engine lives on, orphaned
        leader.wait(60 * TIMEOUT_SCALE)
        events: list[str] = []
        done = child.sweep(None, marker, "127.0.0.1", free_port(), grace=0.5,
                           log=lambda lvl, ev, **kw: events.append(ev))
        assert "child.group_unproven" in events
        if title.startswith("VLLM::"):
            assert engine.pid in done.killed, done
        else:
            assert engine.pid not in done.killed and engine.is_running(), done
