"""A record closed to the reader says what to do, as a closed folder of records does.

Records are 0600 in folders 0700 of the service user: `vllmwatch incidents` as another user
(the operator without sudo) said "record.json: cannot open: Permission denied" for a record,
the one line without the next step the folder's own refusal gives."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from vllmwatch.incident import cli, store

RID = "20261201T000000Z-hang"


def test_a_record_closed_to_this_user_says_who_may_read_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    store.write(str(tmp_path), RID, {store.RECORD: '{"reason": "hang"}'})
    real = os.open

    def closed(path: str, *args: object, **kwargs: object) -> int:
        if str(path).endswith(store.RECORD):  # as for a user other than the service's
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", closed)
    assert cli.main("show", RID, False, [str(tmp_path)]) == 1
    assert cli.main(None, None, False, [str(tmp_path)]) == 0
    got = capsys.readouterr()
    for said in (got.err, got.out):
        assert "Permission denied" in said and "run as root or as the service user" in said, said


def test_json_without_any_records_folder_is_still_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`vllmwatch incidents --json | jq` on a box that has had no record yet: exit 0 with
    nothing on stdout, which no JSON reader takes for "none"."""
    import json

    assert cli.main(None, None, True, [str(tmp_path / "none")], None) == 0
    assert json.loads(capsys.readouterr().out) == {"dir": None, "incidents": []}


@pytest.mark.parametrize("body", ["{not json", None])
def test_an_unreadable_record_points_at_its_report_written_beside_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str | None) -> None:
    """record.json too large for the reader (an [incidents] output_lines of 100000 lines of
    16 KiB), or damaged: "unreadable" was all, while report.txt beside it, the same page
    written with it, could be read."""
    folder = tmp_path / RID
    folder.mkdir()
    (folder / "report.txt").write_text("== reason and timeline ==\n")
    with open(folder / store.RECORD, "w") as fh:
        fh.write(body) if body is not None else fh.truncate(store.MAX_RECORD + 1)
    assert cli.main("show", RID, False, [str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"less {folder / 'report.txt'}" in err, err


@pytest.mark.parametrize("content", [None, b'{"reason": "hang", "det', b'{"reason": "\xff"}'])
def test_an_unreadable_record_without_its_report_names_its_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None) -> None:
    """record.json gone, cut short or not UTF-8, no report.txt beside it: the line named
    record.json and no place and no next step."""
    (tmp_path / RID).mkdir()
    if content is not None:
        (tmp_path / RID / "record.json").write_bytes(content)
    assert cli.main("show", RID, False, [str(tmp_path)], None) == 1
    err = capsys.readouterr().err
    assert f"ls -la {tmp_path / RID}" in err and len(err.splitlines()) == 1, err
