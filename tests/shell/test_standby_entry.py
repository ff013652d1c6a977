"""Which vllm.command a standby can stand in for (shell/standby.py), on real files."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from vllmwatch.shell.standby import Entry, resolve

PYTHON = sys.executable


def _script(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def test_a_console_script_runs_under_its_shebang(tmp_path: Path) -> None:
    script = _script(tmp_path, "vllm", f"#!{PYTHON}\nimport sys\n")
    assert resolve([script, "serve"], None) == Entry(PYTHON, "path", script, 1)


def test_a_bare_name_is_found_on_the_launchs_path(tmp_path: Path) -> None:
    script = _script(tmp_path, "vllm", f"#!{PYTHON}\n")
    assert resolve(["vllm", "serve"], str(tmp_path)) == Entry(PYTHON, "path", script, 1)


def test_env_shebang_and_pips_long_path_trampoline(tmp_path: Path) -> None:
    env = _script(tmp_path, "a", f"#!/usr/bin/env {os.path.basename(PYTHON)}\n")
    got = resolve([env], os.environ["PATH"])
    assert isinstance(got, Entry) and os.path.basename(got.interpreter).startswith("python")
    trampoline = _script(tmp_path, "b", f"#!/bin/sh\n'''exec' \"{PYTHON}\" \"$0\" \"$@\"\n' '''\n")
    assert resolve([trampoline], None) == Entry(PYTHON, "path", trampoline, 1)


def test_python_m_and_python_script(tmp_path: Path) -> None:
    assert resolve([PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--x"], None) == \
        Entry(PYTHON, "module", "vllm.entrypoints.openai.api_server", 3)
    script = _script(tmp_path, "serve.py", "print(1)\n")
    assert resolve([PYTHON, script], None) == Entry(PYTHON, "path", script, 2)
    # The kernel's view of a console script (`init --from-pid` reads it): no .py suffix.
    console = _script(tmp_path, "vllm", f"#!{PYTHON}\nimport sys\n")
    assert resolve([PYTHON, console, "serve"], None) == Entry(PYTHON, "path", console, 2)


@pytest.mark.parametrize(("make", "words"), [
    (lambda t: ["bash", "-c", "vllm serve"], "not a script (a binary or a wrapper)"),
    (lambda t: [_script(t, "w.sh", "#!/bin/sh\nexec vllm \"$@\"\n")], "wrapper"),
    (lambda t: [_script(t, "f", f"#!{PYTHON} -E\n")], "wrapper"),
    (lambda t: [PYTHON, "-u", "-m", "x"], "only `python -m MODULE`"),
    (lambda t: ["no-such-vllm-here"], "not found on PATH"),
    (lambda t: [], "empty"),
])
def test_what_a_standby_cannot_stand_in_for(tmp_path: Path, make: object, words: str) -> None:
    assert callable(make)
    got = resolve(make(tmp_path), os.environ["PATH"])
    assert isinstance(got, str) and words in got, got
