"""The child's TMPDIR leaves room for vLLM's ZMQ IPC socket paths (`ipc://$TMPDIR/<uuid4>`,
at most 107 bytes): a long $TMPDIR made vLLM's start fail in the demo's test ("ipc path ...
is longer than 107 characters")."""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import pytest

from vllmwatch.shell import child


@pytest.mark.parametrize("depth", [1, 12])
def test_the_child_tmpdir_always_fits_an_ipc_socket_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, depth: int) -> None:
    base = tmp_path.joinpath(*["a-long-folder-name"] * depth)
    base.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    marker = uuid.uuid4().hex[:16]
    made = [child.child_tmpdir(marker), child.short_tmpdir(f"vllmwatch-standby-{marker}-")]
    try:
        for path in made:
            assert os.path.isdir(path)
            ipc = f"{path}/{uuid.uuid4()}"
            assert len(os.fsencode(ipc)) <= child.IPC_PATH_MAX, ipc
        short_enough = len(os.fsencode(str(base))) + 80 <= child.IPC_PATH_MAX
        assert made[0].startswith(str(base) if short_enough else child.FALLBACK_TMP + "/")
        child.remove_tmpdirs(marker)  # the run's TMPDIRs, wherever they were made
        assert not os.path.exists(made[0])
    finally:
        for path in made:
            if os.path.isdir(path):
                os.rmdir(path)


@pytest.mark.parametrize("trouble", ["missing", "not a directory"])
def test_a_temp_dir_that_cannot_be_made_is_a_spawn_retried_not_a_crash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trouble: str) -> None:
    """/tmp full (ENOSPC) or gone between two launches: the launch fails and is retried with
    backoff (SpawnFailed, not fatal), naming what to free. Before, the OSError escaped the
    loop: daemon.crashed, exit 70, at every start under systemd."""
    from vllmwatch.config.schema import from_dict
    from vllmwatch.shell import childrun

    base = tmp_path / "tmp"
    if trouble == "not a directory":
        base.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    config = from_dict({"vllm": {"model": "/m", "gpus": []}})
    got = childrun.prepare(config, {"PATH": "/usr/bin:/bin"}, uuid.uuid4().hex[:16], None, {},
                           lambda *a, **k: None)
    assert isinstance(got, childrun.SpawnFailed), got
    assert not got.fatal and "temporary directory" in got.error and "TMPDIR" in got.error
