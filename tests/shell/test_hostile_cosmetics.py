"""Issue 37's cosmetics: a failed incident record names the event that was really logged;
a script whose interpreter is missing, or whose #! line ends in \\r, is said to be that,
not the script missing (the launch and `check`)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from vllmwatch.check.base import FAIL, Context
from vllmwatch.check.vllm import check_vllm
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
