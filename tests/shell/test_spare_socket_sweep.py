"""The spare's socket file left by a vllmwatch killed before it could remove it: removed at
the next start unless something still listens on it (groupfile.remove_stale_socket)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from vllmwatch.shell import groupfile
from vllmwatch.testing.world import LogCapture

INSTANCE = "0123456789abcdef"


def _place(tmp: Path) -> tuple[dict[str, str], Path]:
    state = tmp / "state"
    state.mkdir(mode=0o700)
    (state / "spare").mkdir(mode=0o700)
    return {"STATE_DIRECTORY": str(state)}, state / "spare" / groupfile.spare_socket_name(INSTANCE)


def test_a_socket_nobody_listens_on_is_removed_and_said(tmp_path: Path) -> None:
    env, path = _place(tmp_path)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))  # bound, never unlinked: what a SIGKILLed spare leaves
    log = LogCapture()
    groupfile.remove_stale_socket(env, INSTANCE, log)
    assert not path.exists()
    assert [e["path"] for e in log.named("spare.socket_removed")] == [str(path)]


def test_a_socket_a_leftover_still_listens_on_is_kept(tmp_path: Path) -> None:
    env, path = _place(tmp_path)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        s.listen()
        groupfile.remove_stale_socket(env, INSTANCE, LogCapture())
        assert path.exists()  # restart.kill_stale = false kept that spare: its socket too
    os.unlink(path)


def test_what_is_not_a_socket_is_never_touched(tmp_path: Path) -> None:
    env, path = _place(tmp_path)
    path.write_text("not ours to remove")
    groupfile.remove_stale_socket(env, INSTANCE, LogCapture())
    assert path.read_text() == "not ours to remove"
    path.unlink()
    os.symlink("/etc/passwd", path)  # a link is not followed
    groupfile.remove_stale_socket(env, INSTANCE, LogCapture())
    assert path.is_symlink()
