"""An incident record survives the box going down right after it (issue 37's evidence):
the records that matter most come just before a host dies (a GPU fault that hangs the
kernel, a power cut, the operator's hard reset of a wedged box). store.write made the files
and renamed their folder into place without an fsync, so after such a crash the folder
could be there with an empty record.json (delayed allocation: the name is committed, the
data is not), and `incidents show` said "record.json is not JSON". Every file is synced
before the rename that publishes it, and the folder's entry after it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vllmwatch.incident import store


def test_a_record_is_on_disk_before_its_name_and_its_name_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = str(tmp_path)
    seen: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        seen.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src: str, dst: str) -> None:
        seen.append(("rename", dst))
        real_rename(src, dst)

    monkeypatch.setattr(store.os, "fsync", fsync)
    monkeypatch.setattr(store.os, "rename", rename)
    files = {store.RECORD: '{"reason": "hang"}', "report.txt": "r\n", "output.log": "o\n"}
    rid = store.write(root, store.record_id(1.7e9, "hang"), files)
    final = os.path.join(root, rid)
    at = seen.index(("rename", final))
    synced_before = {Path(p).name for what, p in seen[:at] if what == "fsync"}
    assert set(files) <= synced_before, seen  # the data, before the name points at it
    tmp = [p for what, p in seen[:at] if what == "fsync" and Path(p).name.startswith(".tmp-")]
    assert tmp, seen  # the folder's own entries (its files' names)
    assert ("fsync", os.path.realpath(root)) in seen[at:], seen  # the new name itself
    assert store.read(root, rid) == {"reason": "hang", "id": rid}  # (its folder's name)
