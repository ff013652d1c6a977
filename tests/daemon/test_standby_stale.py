"""A standby whose imported modules changed on disk after its imports (a `pip install -U` of
any package it imported, a `git pull` under an editable install) must not run the launch with
the old modules in memory against the new files: it starts the launch fresh.

vllmwatch's own check (Standby.stale_vllm) stamps vllm/__init__.py only: an upgraded
transformers, torch or an edited vLLM source file went unnoticed, and the launch ran the old
code. Each test owns its standby (killed at the end).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import TIMEOUT_SCALE, wait_for
from vllmwatch.config.command import ChildCommand
from vllmwatch.shell import standby as sb
from vllmwatch.shell.standby import Entry, resolve

ENTRY = f"""\
#!{sys.executable}
import json, os, sys
import dep
if __name__ == "__main__":
    with open(os.environ["OUT"], "w") as fh:
        json.dump({{"version": dep.VERSION, "preimported": True}}, fh)
"""


@pytest.fixture
def made() -> Iterator[list[sb.Standby]]:
    """The standbys a test starts; each is killed (its session) at the end."""
    out: list[sb.Standby] = []
    yield out
    for standby in out:
        standby.kill()


def _start(tmp: Path, made: list[sb.Standby]) -> tuple[sb.Standby, ChildCommand]:
    lib = tmp / "lib"
    lib.mkdir()
    (lib / "dep.py").write_text("VERSION = 'old'\n")
    script = tmp / "fakeserve"
    script.write_text(ENTRY)
    script.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(lib)}
    cmd = ChildCommand(argv=(str(script), "--flag"), env=env)
    entry = resolve(cmd.argv, env["PATH"])
    assert isinstance(entry, Entry)
    standby = sb.start(entry, cmd, (), (), "", "m" * 16)
    made.append(standby)
    launch = ChildCommand(argv=cmd.argv, env={**env, "TMPDIR": str(tmp),
                                              "OUT": str(tmp / "out.json")})
    return standby, launch


def _waiting(standby: sb.Standby) -> bool:
    standby.poll()
    return standby.state == "waiting"


def test_a_module_reinstalled_after_the_imports_makes_the_handover_start_fresh(
        tmp_path: Path, made: list[sb.Standby]) -> None:
    standby, launch = _start(tmp_path, made)
    wait_for(lambda: _waiting(standby), 30, "the standby to report waiting")
    assert "dep" in standby.report["imported"]
    # What pip does: the old file removed, a new one written (a new inode, a new size).
    dep = tmp_path / "lib" / "dep.py"
    dep.unlink()
    dep.write_text(textwrap.dedent("""\
        VERSION = 'new'  # the upgraded package
        """))
    child = standby.hand_over(launch, str(tmp_path), "m" * 16)
    assert child.proc.wait(30 * TIMEOUT_SCALE) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["version"] == "new"  # not the copy imported before the upgrade
    assert "changed on disk since the imports" in child.stdout.read().decode()


def test_an_unchanged_install_is_handed_over_as_imported(
        tmp_path: Path, made: list[sb.Standby]) -> None:
    """The stamps do not discard a good standby: its own script's pinned copy (removed with
    its TMPDIR at the handover) is no imported module that changed."""
    standby, launch = _start(tmp_path, made)
    wait_for(lambda: _waiting(standby), 30, "the standby to report waiting")
    child = standby.hand_over(launch, str(tmp_path), "m" * 16)
    assert child.proc.wait(30 * TIMEOUT_SCALE) == 0
    assert json.loads((tmp_path / "out.json").read_text())["version"] == "old"
    assert "fresh" not in child.stdout.read().decode()
