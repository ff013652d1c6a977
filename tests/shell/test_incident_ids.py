"""`vllmwatch incidents show` names and finds a record one way: by its folder's name.

- `show ID-2 --json` printed the id stored in the record (ID: written as ID, published as
  ID-2 when ID was taken), where the list, the report and `status` say ID-2.
- `show ID/` (a shell's completion of the folder) was refused as no incident id.
- An id that begins two records of the first folder showed another folder's record that it
  begins alone, where the same id alone in the first folder is "give more of it".
- `-c a -c ./a`, one file named two ways, was refused as two config files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vllmwatch import cli
from vllmwatch.incident import cli as incident_cli

RID = "20261201T093000Z-hang"


def _record(root: Path, name: str, stored_id: str | None = None) -> None:
    (root / name).mkdir(parents=True, mode=0o700)
    (root / name / "record.json").write_text(json.dumps(
        {"id": stored_id or name, "reason": "hang", "detail": f"of {name}",
         "time_utc": "2026-12-01T09:30:00Z"}))


def test_show_json_names_the_record_by_its_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _record(tmp_path, RID)
    _record(tmp_path, RID + "-2", stored_id=RID)
    assert incident_cli.main("show", RID + "-2", True, [str(tmp_path)], None) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["id"] == RID + "-2" and shown["stored_id"] == RID
    assert shown["detail"] == f"of {RID}-2"
    listed = incident_cli.main(None, None, True, [str(tmp_path)], None)
    assert listed == 0 and [r["id"] for r in json.loads(capsys.readouterr().out)[
        "incidents"]] == [RID, RID + "-2"]


@pytest.mark.parametrize("asked", [RID + "/", RID + "//"])
def test_a_trailing_slash_names_the_same_record(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], asked: str) -> None:
    _record(tmp_path, RID)
    _record(tmp_path, RID + "-2")
    assert incident_cli.main("show", asked, True, [str(tmp_path)], None) == 0
    assert json.loads(capsys.readouterr().out)["id"] == RID


def test_an_id_that_begins_two_here_is_not_another_folders(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    _record(first, RID)
    _record(first, RID + "-2")
    _record(second, "20261201T093000Z-halt")
    code = incident_cli.main("show", "20261201T093000Z-ha", False,
                             [str(first), str(second)], None)
    err = capsys.readouterr().err
    assert code == 1 and "begins 2 ids" in err and str(first) in err, err


def test_one_config_file_named_two_ways_is_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "v.toml").write_text('[vllm]\nmodel = "/m"\n')
    os.symlink("v.toml", tmp_path / "link.toml")
    monkeypatch.chdir(tmp_path)
    seen: list[str | None] = []
    monkeypatch.setattr(cli, "_dispatch", lambda args: seen.append(args.config) or 0)
    for other in ("./v.toml", str(tmp_path / "v.toml"), "link.toml"):
        assert cli.main(["-c", "v.toml", "incidents", "-c", other]) == 0, other
    assert seen == ["v.toml"] * 3
    assert cli.main(["-c", "v.toml", "-c", "w.toml", "incidents"]) == 2
    assert "names 2 files" in capsys.readouterr().err
