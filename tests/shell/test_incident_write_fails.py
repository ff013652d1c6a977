"""A record that cannot be written says where and what to do, in one line.

The error named the hidden folder the record was being written in (`.../incidents/.tmp-
20261201T000000Z-hang-812`), which the failure had just removed, and said no more: the
reader of `incident.failed` at 3 a.m. was given a path that is not there and no next step."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from vllmwatch.config.command import ChildCommand
from vllmwatch.config.schema import from_dict
from vllmwatch.core.actions import RecordIncident
from vllmwatch.core.events import IncidentRecorded
from vllmwatch.core.names import Reason
from vllmwatch.incident import dumpers, record, store
from vllmwatch.shell import incidents
from vllmwatch.shell.incidents import STACKS, IncidentShell
from vllmwatch.testing.world import LogCapture

CONFIG = from_dict({"vllm": {"model": "/m"}})


def _command() -> ChildCommand:
    return ChildCommand(argv=("vllm", "serve", "/m"), env={})


class _NoGpu:
    def gpu_processes(self) -> None:
        return None

    def device_used_mib(self) -> dict[int, float]:
        return {}


@pytest.mark.parametrize("code,words", [
    (errno.ENOSPC, "free space"), (errno.EDQUOT, "free space"),
    (errno.EROFS, "writable"), (errno.EACCES, "writable")])
def test_a_failed_write_names_the_folder_and_the_next_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, words: str) -> None:
    (tmp_path / "state").mkdir(mode=0o700)
    shell = IncidentShell(CONFIG, LogCapture(),
                          {"STATE_DIRECTORY": str(tmp_path / "state")})
    assert shell.root is not None

    def refuse(path: str, *_: object) -> None:
        raise OSError(code, os.strerror(code), path)

    monkeypatch.setattr(store.os, "mkdir", refuse)
    got = shell.record(RecordIncident(1, Reason.HANG, "x", 3.0, None), None, None,
                       _NoGpu())  # type: ignore[arg-type]  # only the calls record makes
    assert got.error.startswith(f"cannot write an incident record in {shell.root}: "
                                f"{os.strerror(code)}"), got.error
    assert ".tmp-" not in got.error and words in got.error and "\n" not in got.error, got.error
    # ORDER's line, put when the capture began, goes with the failed write: none is left
    # naming no record (a reader skipped it, but it stayed for good)
    assert [n for n in os.listdir(shell.root) if n != store.ORDER] == [], os.listdir(shell.root)
    assert _order(shell.root) == [] and store.written(shell.root) == []


def _order(root: str) -> list[str]:
    path = Path(root, store.ORDER)
    return path.read_text().split() if path.exists() else []


def _record(shell: IncidentShell) -> str:
    got = shell.record(RecordIncident(1, Reason.HANG, "x", 3.0, None), None, None,
                       _NoGpu())  # type: ignore[arg-type]  # only the calls record makes
    return got.error


@pytest.mark.parametrize("fails", ["fsync", "rename", "files", "build"])
def test_a_write_that_fails_half_way_leaves_no_trace_and_says_so_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str) -> None:
    """A full disk at the sync, a rename refused, a bug while the files are made or before
    the write: the reservation's line in ORDER stayed (an id with no record, for good), and
    an exception that is no OSError came back as io.failed with a traceback and then a bare
    incident.failed. Now: no hidden folder, ORDER as it was, one error naming the folder."""
    (tmp_path / "state").mkdir(mode=0o700)
    shell = IncidentShell(CONFIG, LogCapture(), {"STATE_DIRECTORY": str(tmp_path / "state")})
    assert shell.root is not None and _record(shell) == ""
    before = _order(shell.root)
    assert len(before) == 1

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def bug(*_: object, **__: object) -> None:
        raise KeyError("oops")

    target = {"fsync": (store.os, "fsync", full), "rename": (store.os, "rename", full),
              "files": (record, "files_of", bug), "build": (record, "build", bug)}[fails]
    monkeypatch.setattr(*target)
    error = _record(shell)
    assert error.startswith(f"cannot write an incident record in {shell.root}: "), error
    assert ("free space" if fails in ("fsync", "rename") else "KeyError: 'oops' at ") in error
    assert "\n" not in error and ".tmp-" not in error, error
    assert sorted(os.listdir(shell.root)) == sorted([*before, store.ORDER]), os.listdir(
        shell.root)
    assert _order(shell.root) == before and store.written(shell.root) == before


def test_a_failed_reservation_between_others_leaves_theirs(tmp_path: Path) -> None:
    """Two captures overlap and the first one's write fails: its line goes, the second's
    (its folder not there yet) and the records' stay, in their order."""
    root = str(tmp_path)
    old = store.write(root, "20261201T000000Z-hang", {store.RECORD: "{}"})
    first = store.reserve(root, "20261201T000001Z-hang")
    second = store.reserve(root, "20261201T000002Z-crash")
    store.release(first, root)
    assert _order(root) == [old, second]
    store.write(root, second, {store.RECORD: "{}"})
    store.release(second, root)
    assert _order(root) == [old, second] == store.written(root)


def test_a_prune_that_fails_after_the_write_is_no_failed_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record was written; then the prune raised (its folder listed while it was being
    removed): incident.failed said no record was written, and status paired none."""
    (tmp_path / "state").mkdir(mode=0o700)
    shell = IncidentShell(CONFIG, LogCapture(), {"STATE_DIRECTORY": str(tmp_path / "state")})
    assert shell.root is not None

    def gone(*_: object, **__: object) -> None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory")

    monkeypatch.setattr(store, "prune", gone)
    got = shell.record(RecordIncident(1, Reason.HANG, "x", 3.0, None), None, None,
                       _NoGpu())  # type: ignore[arg-type]  # only the calls record makes
    assert got.error == "" and store.load(shell.root, got.incident_id) is not None
    assert _order(shell.root) == [got.incident_id]


def test_an_incidents_folder_removed_by_hand_is_made_again(tmp_path: Path) -> None:
    """`rm -rf /var/lib/vllmwatch/incidents` to clear old records while the unit runs: every
    later record failed ("No such file or directory") until vllmwatch was restarted."""
    (tmp_path / "state").mkdir(mode=0o700)
    shell = IncidentShell(CONFIG, LogCapture(),
                          {"STATE_DIRECTORY": str(tmp_path / "state")})
    assert shell.root is not None
    shutil.rmtree(shell.root)
    got = shell.record(RecordIncident(1, Reason.HANG, "x", 3.0, None), None, None,
                       _NoGpu())  # type: ignore[arg-type]  # only the calls record makes
    assert not got.error, got.error
    assert store.load(shell.root, got.incident_id) is not None
    assert stat.S_IMODE(os.stat(shell.root).st_mode) == 0o700
    shutil.rmtree(shell.root)  # and the next launch's faulthandler folder with it
    assert shell.child_command(_command(), CONFIG).env.get(dumpers.STACKS_ENV) == str(
        Path(shell.root, STACKS))


@pytest.mark.parametrize("linked", ["state", "incidents"])
def test_a_linked_folder_is_said_to_be_a_link_not_a_mode(tmp_path: Path, linked: str) -> None:
    """The records moved to a bigger disk through a symbolic link: refused (only a real
    directory is trusted), and the event said "not a private directory (mode 777)", the
    link's own mode, which no chmod changes."""
    elsewhere = tmp_path / "bigdisk"
    elsewhere.mkdir(mode=0o700)
    state = tmp_path / "state"
    if linked == "state":
        state.symlink_to(elsewhere)
    else:
        state.mkdir(mode=0o700)
        (state / "incidents").symlink_to(elsewhere)
    log = LogCapture()
    shell = IncidentShell(CONFIG, log, {"STATE_DIRECTORY": str(state)})
    assert shell.root is None
    [said] = [fields for _event, fields in log.got]
    assert "symbolic link" in said["detail"] and "mode" not in said["detail"], said


def test_a_capture_that_hangs_keeps_one_worker_not_one_per_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hung network mount under the state directory: no I/O of the store is bounded, so a
    capture blocks for good. The restart waits only until the core's deadline
    (tests/loop/test_incident_loop.py: ..._holds_the_restart_for_its_deadline_only), but its
    worker stayed blocked: each restart took one more of the loop's ten, until no probe,
    sweep or memory sample had one. Past its deadline, no other capture is begun (an answer
    at once, naming the folder) until the hung one returns; then records are written again."""
    (tmp_path / "state").mkdir(mode=0o700)
    shell = IncidentShell(CONFIG, LogCapture(), {"STATE_DIRECTORY": str(tmp_path / "state")})
    assert shell.root is not None
    monkeypatch.setattr(incidents, "WAIT_MARGIN", 0.0)
    hung, entered = threading.Event(), threading.Event()
    write = store._write

    def hangs(*args: Any) -> str:
        entered.set()
        assert hung.wait(30)
        return write(*args)

    monkeypatch.setattr(store, "_write", hangs)

    def ask(seq: int) -> IncidentRecorded:
        return shell.record(RecordIncident(seq, Reason.HANG, "x", 0.05, None), None, None,
                            _NoGpu())  # type: ignore[arg-type]  # only the calls record makes
    first: list[IncidentRecorded] = []
    worker = threading.Thread(target=lambda: first.append(ask(1)), daemon=True)
    worker.start()
    try:
        assert entered.wait(10)
        time.sleep(0.1)  # past the first one's deadline (timeout 0.05 s, no margin)
        refused = ask(2)  # (begun, it would wait for the hung write: no figure of speed)
        assert refused.error.startswith(f"not begun: an earlier record's capture in "
                                        f"{shell.root} has not returned"), refused.error
        assert "hung mount" in refused.error and store.written(shell.root) == []
    finally:
        hung.set()
        worker.join(10)
    assert first and first[0].error == "", first
    monkeypatch.setattr(store, "_write", write)
    again = ask(3)
    assert again.error == "" and store.written(shell.root) == [first[0].incident_id,
                                                                again.incident_id]


@pytest.mark.parametrize("hangs_at", ["the store's write", "the first look at the folder"])
def test_a_hung_mount_refuses_the_next_capture_before_it_touches_the_mount(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hangs_at: str) -> None:
    """A hung mount blocks every call under it, not only the store's writes: record() looked
    at the incidents folder (`_root_now`, an lstat under the state directory) before it asked
    whether an earlier capture was hung, and counted a capture as begun only after that look:
    each restart's worker blocked there, one more per restart, the very thing the guard is
    for. A capture counts from its first I/O, and one refused touches nothing under it."""
    (tmp_path / "state").mkdir(mode=0o700)
    shell = IncidentShell(CONFIG, LogCapture(), {"STATE_DIRECTORY": str(tmp_path / "state")})
    root = shell.root
    assert root is not None
    monkeypatch.setattr(incidents, "WAIT_MARGIN", 0.0)
    hung, entered = threading.Event(), threading.Event()
    write, lexists = store._write, os.path.lexists

    def hangs(*args: Any) -> str:
        entered.set()
        assert hung.wait(30)
        return write(*args)

    def blocks_under_root(path: Any) -> bool:  # the mount: every lookup under it hangs now
        if str(path).startswith(root) and (entered.is_set() or hangs_at != "the store's write"):
            entered.set()
            assert hung.wait(30)
        return lexists(path)

    monkeypatch.setattr(store, "_write", hangs)
    monkeypatch.setattr(os.path, "lexists", blocks_under_root)

    def ask(seq: int) -> IncidentRecorded:
        return shell.record(RecordIncident(seq, Reason.HANG, "x", 0.05, None), None, None,
                            _NoGpu())  # type: ignore[arg-type]  # only the calls record makes
    first = threading.Thread(target=lambda: ask(1), daemon=True)
    first.start()
    second: list[IncidentRecorded] = []
    try:
        assert entered.wait(10)
        time.sleep(0.1)  # past the first one's deadline (timeout 0.05 s, no margin)
        worker = threading.Thread(target=lambda: second.append(ask(2)), daemon=True)
        worker.start()
        worker.join(10)  # (it does no I/O: blocked, it waits for the hung one, 30 s)
        assert second and second[0].error.startswith("not begun"), second
    finally:
        hung.set()
        first.join(10)
