"""A record that cannot be written says where and what to do, in one line.

The error named the hidden folder the record was being written in (`.../incidents/.tmp-
20261201T000000Z-hang-812`), which the failure had just removed, and said no more: the
reader of `incident.failed` at 3 a.m. was given a path that is not there and no next step."""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

import pytest

from vllmwatch.config.command import ChildCommand
from vllmwatch.config.schema import from_dict
from vllmwatch.core.actions import RecordIncident
from vllmwatch.core.names import Reason
from vllmwatch.incident import dumpers, store
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
    # (ORDER's line, put when the capture began, names no folder: no record for a reader)
    assert [n for n in os.listdir(shell.root) if n != store.ORDER] == [], os.listdir(shell.root)
    assert store.written(shell.root) == []


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
