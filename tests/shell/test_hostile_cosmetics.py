"""Issue 37's cosmetics: a failed incident record names the event that was really logged;
a script whose interpreter is missing, or whose #! line ends in \\r, is said to be that,
not the script missing (the launch and `check`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from vllmwatch.check.base import FAIL, Context
from vllmwatch.check.vllm import check_vllm
from vllmwatch.config import vllminfo
from vllmwatch.config.schema import from_dict
from vllmwatch.core.actions import RecordIncident
from vllmwatch.core.names import Reason
from vllmwatch.shell import childrun
from vllmwatch.shell.childrun import ChildHandle
from vllmwatch.shell.incidents import IncidentShell
from vllmwatch.testing.world import LogCapture

CONFIG = from_dict({"vllm": {"model": "/m"}})


def _state(tmp_path: Path, case: str) -> dict[str, str]:
    state = tmp_path / "state"
    if case == "state_dir":  # a state directory others may write: untrusted
        state.mkdir(mode=0o777)
        state.chmod(0o777)
    else:  # a good state directory whose incidents folder is untrusted
        state.mkdir(mode=0o700)
        (state / "incidents").mkdir()
        (state / "incidents").chmod(0o777)
    return {"STATE_DIRECTORY": str(state)}


@pytest.mark.parametrize("case", ["state_dir", "incidents_dir"])
def test_a_failed_record_points_at_an_event_that_was_logged(tmp_path: Path, case: str) -> None:
    log = LogCapture()
    shell = IncidentShell(CONFIG, log, _state(tmp_path, case))
    got = shell.record(RecordIncident(1, Reason.CRASH, "x", 3.0, None), None, None,
                       None)  # type: ignore[arg-type]  # no sampler: returns before using it
    named = re.findall(r"the ([a-z_]+\.[a-z_]+) event", got.error)
    assert named and all(log.named(event) for event in named), (got.error, log.got)


@pytest.mark.parametrize("shebang,words", [
    ("#!/nonexistent/venv/bin/python3\n", "its interpreter /nonexistent/venv/bin/python3"),
    ("#!/usr/bin/python3\r\n", "ends in a carriage return"),
])
def test_a_script_that_cannot_run_says_why_not_that_it_is_missing(
        tmp_path: Path, shebang: str, words: str) -> None:
    script = tmp_path / "vllm"
    script.write_text(shebang + "print('never')\n")
    script.chmod(0o755)
    config = from_dict({"vllm": {"model": "/m", "command": [str(script), "serve"]},
                        "prewarm": {"enabled": False}})
    result = check_vllm(Context(config, fast=True))
    assert result.status == FAIL and words in result.detail, result
    assert "not found" not in result.detail
    prepared = childrun.prepare(config, {"PATH": "/usr/bin:/bin"}, "m", None, {},
                                LogCapture())
    assert isinstance(prepared, childrun.Prepared)
    handle, event = ChildHandle.launch(childrun.PopenLauncher("m"), prepared, config, "m",
                                       False, None, lambda e: None, LogCapture(), {})
    assert handle is None and words in getattr(event, "error", ""), event


@pytest.mark.parametrize("env", [{"A=B": "x"}, {"C": "a\0b"}])
def test_a_command_no_process_can_have_is_a_refused_launch_not_a_crash(
        tmp_path: Path, env: dict[str, str]) -> None:
    """The load refuses the forms it knows (tests/shell/test_check_config_only.py); whatever
    still reaches the spawn (an env_file, a key file) is a fatal SpawnFailed naming what to
    check, never the daemon's crash (exit 70, a traceback)."""
    from dataclasses import replace

    config = from_dict({"vllm": {"model": "/m", "command": [sys.executable, "-c", "0"]},
                        "prewarm": {"enabled": False}})
    prepared = childrun.prepare(config, {"PATH": "/usr/bin:/bin"}, "m", None, {},
                                LogCapture())
    assert isinstance(prepared, childrun.Prepared)
    prepared = replace(prepared, cmd=replace(prepared.cmd, env={**prepared.cmd.env, **env}))
    handle, event = ChildHandle.launch(childrun.PopenLauncher("m"), prepared, config, "m",
                                       False, None, lambda e: None, LogCapture(), {})
    assert handle is None and getattr(event, "fatal", False), event
    assert "cannot be started" in getattr(event, "error", ""), event


def _as_a_stranger(work: Callable[[], list[str]]) -> list[str]:
    """work() as a user the test's folders are closed to: as root, in a forked child that
    became nobody (root enters any folder); else in process, the folders being mode 0."""
    if os.geteuid() != 0:
        return work()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nobody, runs work, sends its answer, leaves without cleanup
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            os.write(write, json.dumps(work()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        got = fh.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return list(json.loads(got))


@pytest.mark.parametrize("where", ["interpreter", "script"])
def test_a_vllm_the_service_user_cannot_reach_is_said_so_not_missing(where: str) -> None:
    """The vLLM venv's python links into /root/.pyenv (or a 0700 home): the service user gets
    EACCES, and `check`, a reload and the launch said the interpreter "does not" exist and to
    reinstall the venv (or "not found on PATH; install vLLM"), which is true only for root.
    Each names the folder closed to this user and what to do."""
    top = tempfile.mkdtemp(prefix="vw-reach-", dir="/tmp")
    try:
        os.chmod(top, 0o755)
        closed = Path(top) / "home"
        (closed / "bin").mkdir(parents=True)
        (closed / "bin" / "python3").symlink_to(sys.executable)
        (Path(top) / "bin").mkdir()
        script = (Path(top) if where == "interpreter" else closed) / "bin" / "vllm"
        script.write_text(f"#!{closed}/bin/python3\nprint('never')\n")
        script.chmod(0o755)
        closed.chmod(0o700 if os.geteuid() == 0 else 0)
        config = from_dict({"vllm": {"model": "/m", "command": [str(script), "serve"]},
                            "prewarm": {"enabled": False}})

        def work() -> list[str]:
            said = [check_vllm(Context(config, fast=True)).detail]
            said += [p.problem for p in vllminfo.launch_problems(config, {})]
            prepared = childrun.prepare(config, {"PATH": "/usr/bin:/bin"}, "m", None, {},
                                        LogCapture())
            assert isinstance(prepared, childrun.Prepared)
            handle, event = ChildHandle.launch(childrun.PopenLauncher("m"), prepared, config,
                                               "m", False, None, lambda e: None, LogCapture(),
                                               {})
            assert handle is None
            return [*said, getattr(event, "error", "")]

        said = _as_a_stranger(work)
    finally:
        closed.chmod(0o700)
        shutil.rmtree(top)
    assert len(said) == 3
    for text in said:
        assert f"{closed} is closed to it (permission denied)" in text, said
        assert "does not" not in text and "not found" not in text, said
