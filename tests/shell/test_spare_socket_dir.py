"""The spare's Unix socket (its dev-mode endpoints: /sleep, /wake_up, /collective_rpc) lies
in a directory no other user may enter, whatever the state directory's mode (systemd makes
StateDirectory 0755 by default) and whatever umask vLLM creates the socket under (UMask=0000
made it connectable by every local user). shell/sparefx.py socket_path, safefile.closed_dir.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

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


def test_no_place_for_the_socket_names_each_place_why_and_what_to_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A state directory too deep for a Unix socket's path (107 bytes) and a /tmp fallback
    that is not ours alone: the spare is off, and the warning said only "no private
    directory": not which paths, not why, not what to change."""
    from vllmwatch.config import safefile
    from vllmwatch.config.schema import from_dict
    from vllmwatch.shell import sparefx
    from vllmwatch.testing.driver import LogCapture

    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    real = safefile.private_dir
    monkeypatch.setattr(safefile, "private_dir", lambda p: None if p.startswith(
        "/tmp/vllmwatch-") else real(p))  # another user's, in this test
    config = from_dict({"vllm": {"command": ["vllm", "serve"], "model": "m", "gpus": [0]},
                        "spare": {"enabled": "true"},
                        "gate": {"enabled": True, "listen": "127.0.0.1:9"}},
                       path=str(tmp_path / "vllmwatch.toml"))
    log = LogCapture()
    sampler: Any = None  # never reached: the socket's place is decided first
    assert sparefx.make(config, {"STATE_DIRECTORY": str(deep)}, sampler, False, log) is None
    [said] = log.named("spare.plan")
    assert said["level"] == "warning" and not said["on"], said
    assert f"{deep}/spare/spare-" in said["detail"] and "over the 107" in said["detail"], said
    assert f"/tmp/vllmwatch-{os.geteuid()}" in said["detail"], said
    assert "state directory of at most 77 characters" in said["todo"], said
