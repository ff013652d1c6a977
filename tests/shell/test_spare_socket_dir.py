"""The spare's Unix socket (its dev-mode endpoints: /sleep, /wake_up, /collective_rpc) lies
in a directory no other user may enter, whatever the state directory's mode (systemd makes
StateDirectory 0755 by default) and whatever umask vLLM creates the socket under (UMask=0000
made it connectable by every local user). shell/sparefx.py socket_path, safefile.closed_dir.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from vllmwatch.shell.sparefx import socket_path


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o000])
@pytest.mark.parametrize("state_mode", [0o755, 0o700, 0o711])
def test_the_socket_directory_is_closed_to_other_users(tmp_path: Path, umask: int,
                                                       state_mode: int) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=state_mode)
    state.chmod(state_mode)
    old = os.umask(umask)
    try:
        path = socket_path({"STATE_DIRECTORY": str(state)}, "abcdef0123456789")
    finally:
        os.umask(old)
    assert path is not None
    parent = os.path.dirname(path)
    assert _mode(parent) & 0o077 == 0, oct(_mode(parent))
    assert Path(parent).parent == state or not str(parent).startswith(str(state))


def test_a_looser_directory_left_from_before_is_closed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "spare").mkdir(parents=True)
    (state / "spare").chmod(0o755)
    state.chmod(0o755)
    path = socket_path({"STATE_DIRECTORY": str(state)}, "abcdef0123456789")
    assert path is not None and os.path.dirname(path) == str(state / "spare")
    assert _mode(state / "spare") == 0o700


def test_a_link_in_its_place_is_not_followed(tmp_path: Path) -> None:
    state, elsewhere = tmp_path / "state", tmp_path / "elsewhere"
    state.mkdir()
    elsewhere.mkdir(mode=0o777)
    elsewhere.chmod(0o777)
    (state / "spare").symlink_to(elsewhere)
    path = socket_path({"STATE_DIRECTORY": str(state)}, "abcdef0123456789")
    assert path is None or not path.startswith(str(state / "spare") + os.sep)
    assert _mode(elsewhere) == 0o777  # never changed through the link
    if path is not None:
        assert _mode(os.path.dirname(path)) & 0o077 == 0
