"""An entry of the records folder named as a record that is no record's folder is said.

A record folder moved to a bigger disk and linked back (or a file of a record's name) was
left out of `vllmwatch incidents` without a word, and `show` of it said "no incident": the
record seemed lost. Only a real folder is read as a record (the folder is the service
user's; shell/incidents.py trusts no link either), and each such entry is named, with why
and what to do, on stderr and in --json's left_out."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vllmwatch.incident import cli as incident_cli

RID = "20261201T093000Z-hang"
MOVED = "20261202T000000Z-crash"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "incidents"
    for name, where in ((RID, folder), (MOVED, tmp_path / "big")):
        (where / name).mkdir(parents=True)
        (where / name / "record.json").write_text(json.dumps({"id": name, "reason": "x"}))
    os.symlink(tmp_path / "big" / MOVED, folder / MOVED)
    (folder / "20261203T000000Z-hang").write_text("a file")
    return folder


def test_the_list_names_what_it_left_out(root: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert incident_cli.main(None, None, False, [str(root)], None) == 0
    out, err = capsys.readouterr()
    assert RID in out and MOVED not in out
    assert f"{root / MOVED} left out: a symbolic link (to {root.parent / 'big' / MOVED})" \
        in err and "--dir" in err, err
    assert "20261203T000000Z-hang left out: not a folder" in err, err
    assert incident_cli.main(None, None, True, [str(root)], None) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in listed["incidents"]] == [RID]
    assert [r["id"] for r in listed["left_out"]] == [MOVED, "20261203T000000Z-hang"]


def test_show_of_a_link_says_it_is_one(root: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert incident_cli.main("show", MOVED, False, [str(root)], None) == 1
    err = capsys.readouterr().err
    assert f"{root / MOVED} is a symbolic link" in err and "no incident" not in err, err

