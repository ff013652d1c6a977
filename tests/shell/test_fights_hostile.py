"""Issue 37 §3-4: `check`'s fights scan over files any local user can plant. A FIFO, a
device, a huge file, a dangling or looping link, a file that cannot be read or a read that
hangs is one WARN naming the path; it never blocks the scan, never fills memory, never turns
the result into a FAIL, and never hides the real findings beside it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.shell.test_fights import HAND_UNIT, plant, run
from vllmwatch.check import fights
from vllmwatch.check.base import FAIL, WARN
from vllmwatch.config import safefile

HANG_GUARD = 120  # s: only so that a regression fails instead of hanging the suite
USER_UNITS = "home/alice/.config/systemd/user"
CRON = "*/30 * * * * root pkill -f 'vllm serve'\n"


def _plant_hostile(root: Path, kind: str) -> str:
    """One hostile file among real fighters; its path as the scan names it."""
    plant(root, {"etc/systemd/system/hand-vllm.service": HAND_UNIT,
                 "etc/cron.d/vllm-kill": CRON})
    where = {"fifo_unit": f"{USER_UNITS}/evil.service", "zero_unit": f"{USER_UNITS}/z.service",
             "huge_crontab": "var/spool/cron/crontabs/mallory",
             "dangling_unit": "etc/systemd/system/gone.service",
             "looping_unit": "etc/systemd/system/loop.service",
             "directory_unit": "etc/systemd/system/odd.service",
             "fifo_cron": "etc/cron.d/pipe"}[kind]
    path = root / where
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind.startswith("fifo"):
        os.mkfifo(path)
    elif kind == "zero_unit":
        path.symlink_to("/dev/zero")
    elif kind == "huge_crontab":
        with open(path, "wb") as fh:
            fh.truncate(300 << 20)  # sparse: 300 MB of one NUL line, no disk used
    elif kind == "dangling_unit":
        path.symlink_to("/usr/lib/systemd/system/removed-by-apt.service")
    elif kind == "looping_unit":
        path.symlink_to(path.name)
    else:
        path.mkdir()
    return "/" + where


def _scan_in_a_child(root: Path) -> list[tuple[str, str, str]]:
    code = ("import sys; from tests.shell.test_fights import run; from pathlib import Path; "
            f"[print(r.name, r.status, r.detail, sep='\\t') for r in run(Path({str(root)!r}), "
            f"Path({str(root / 'proc')!r}))]")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=HANG_GUARD, check=True, env={**os.environ})
    return [tuple(line.split("\t", 2)) for line in out.stdout.splitlines()]  # type: ignore


@pytest.mark.parametrize("kind", ["fifo_unit", "zero_unit", "huge_crontab", "dangling_unit",
                                  "looping_unit", "directory_unit", "fifo_cron"])
def test_a_hostile_file_is_one_warn_naming_it_and_the_real_findings_stay(
        tmp_path: Path, kind: str) -> None:
    (tmp_path / "proc").mkdir()
    where = _plant_hostile(tmp_path, kind)
    got = _scan_in_a_child(tmp_path)
    about = [r for r in got if r[0] == f"fights {where}"]
    assert len(about) == 1 and about[0][1] == WARN and "not scanned: " in about[0][2], got
    names = {r[0] for r in got}
    assert "fights /etc/systemd/system/hand-vllm.service:6" in names, got
    assert "fights /etc/cron.d/vllm-kill:1" in names, got
    assert all(r[1] != FAIL for r in got), got


def test_a_read_that_hangs_is_cut_at_its_deadline(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    plant(tmp_path, {"etc/systemd/system/hand-vllm.service": HAND_UNIT,
                     f"{USER_UNITS}/slow.service": "[Service]\nExecStart=/bin/true\n"})
    (tmp_path / "proc").mkdir()
    release = threading.Event()
    real = safefile.read_bounded

    def hung(path: str, *a: object, **k: object) -> bytes:
        if path.endswith("slow.service"):
            release.wait()  # a hung network mount
        return real(path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(safefile, "read_bounded", hung)
    monkeypatch.setattr(fights, "READ_TIMEOUT", 0.2)
    try:
        got = run(tmp_path, tmp_path / "proc")
    finally:
        release.set()
    slow = [r for r in got if r.name == f"fights /{USER_UNITS}/slow.service"]
    assert len(slow) == 1 and "did not answer within" in slow[0].detail
    assert any(r.name == "fights /etc/systemd/system/hand-vllm.service:6" for r in got)


def test_past_the_scan_deadline_the_rest_is_said_not_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plant(tmp_path, {"etc/systemd/system/hand-vllm.service": HAND_UNIT})
    (tmp_path / "proc").mkdir()
    monkeypatch.setattr(fights, "SCAN_TIMEOUT", 0.0)
    got = run(tmp_path, tmp_path / "proc")
    late = [r for r in got if r.name == "fights" and "deadline" in r.detail]
    assert len(late) == 1 and "/etc/systemd/system/hand-vllm.service" in late[0].detail
