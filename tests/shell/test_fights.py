"""`check` finds what fights the service: planted cron lines, units, supervisord programs and
a hand-started `vllm serve` on our GPUs, each a WARN naming where and what to do; quiet on a
clean root; never changes a file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import owned, wait_for
from vllmwatch.check import fights
from vllmwatch.check.base import PASS, SKIP, WARN, Context
from vllmwatch.config.schema import from_dict

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GUIDE_CRON = (FIXTURES / "vllm-watch.cron").read_text()
HAND_UNIT = """[Unit]
Description=vLLM (by hand)

[Service]
Environment=CUDA_VISIBLE_DEVICES=0
ExecStart=/opt/vllm/bin/vllm serve /data/models/qwen35-9b --port 8000
Restart=always

[Install]
WantedBy=multi-user.target
"""
SUPERVISOR = "[program:vllm]\ncommand=/opt/vllm/bin/vllm serve /data/m --port 8000\n"
SCRIPT = ("#!/bin/sh\nused=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,"
          "nounits)\n[ \"$used\" -gt 75000 ] && killall -9 vllm\n")


def plant(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def snapshot(root: Path) -> dict[str, tuple[bytes, float]]:
    return {str(p): (p.read_bytes(), p.stat().st_mtime) for p in root.rglob("*") if p.is_file()}


def run(root: Path, proc: Path, gpus: object = None, path: str = "<config>"
        ) -> list[fights.CheckResult]:
    vllm: dict[str, object] = {"model": "/m"}
    if gpus is not None:
        vllm["gpus"] = gpus
    ctx = Context(from_dict({"vllm": vllm}, path), scan_root=str(root), proc_root=str(proc))
    return fights.check_fights(ctx)


CASES = [
    ("the guide's cron.d file", {"etc/cron.d/vllm-watch": GUIDE_CRON},
     "/etc/cron.d/vllm-watch:3", ["kills or restarts vLLM", "pkill -f", "delete the line",
                                  # what replaces it (issue 36.7)
                                  "[memory] rules", "memory.gpu_limit", "gpu_growth_rate",
                                  "DGX Spark the old figure was system memory"]),
    ("a user crontab", {"var/spool/cron/crontabs/alice": "*/30 * * * * pkill -f 'vllm serve'\n"},
     "/var/spool/cron/crontabs/alice:1", ["crontab -e -u alice"]),
    ("a cron line running a script that kills vLLM",
     {"etc/crontab": "*/5 * * * * root /usr/local/bin/vllm-guard.sh\n",
      "usr/local/bin/vllm-guard.sh": SCRIPT},
     "/etc/crontab:1", ["vllm-guard.sh", "killall -9 vllm"]),
    ("a hand-written unit", {"etc/systemd/system/vllm.service": HAND_UNIT},
     "/etc/systemd/system/vllm.service:6", ["starts vLLM", "systemctl disable --now vllm"]),
    ("a timer's unit that kills vLLM",
     {"etc/systemd/system/vllm-restart.service":
      "[Service]\nType=oneshot\nExecStart=/usr/bin/systemctl restart vllm\n",
      "etc/systemd/system/vllm-restart.timer": "[Timer]\nOnCalendar=hourly\n"},
     "/etc/systemd/system/vllm-restart.service:3",
     ["systemctl disable --now vllm-restart.timer"]),
    ("a supervisord program", {"etc/supervisor/conf.d/vllm.conf": SUPERVISOR},
     "/etc/supervisor/conf.d/vllm.conf:2", ["supervisorctl stop vllm"]),
]


@pytest.mark.parametrize("files,where,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_planted_fighters_warn_with_where_and_what_to_do(tmp_path: Path, files: dict[str, str],
                                                         where: str, words: list[str]) -> None:
    root = tmp_path / "root"
    plant(root, files)
    before = snapshot(root)
    got = run(root, tmp_path / "noproc", gpus=[0])
    warns = [r for r in got if r.status == WARN]
    assert len(warns) == 1, got
    assert warns[0].name == f"fights {where}"
    for word in words:
        assert word in warns[0].detail, warns[0].detail
    assert snapshot(root) == before  # read-only


def test_a_clean_root_is_quiet(tmp_path: Path) -> None:
    plant(tmp_path / "root", {
        "etc/crontab": "17 * * * * root cd / && run-parts --report /etc/cron.hourly\n",
        "etc/systemd/system/vllmwatch.service": "[Service]\nExecStart=/usr/bin/vllmwatch run\n",
        "etc/systemd/system/nginx.service": "[Service]\nExecStop=/bin/kill -s QUIT $MAINPID\n",
    })
    (tmp_path / "proc").mkdir()
    got = run(tmp_path / "root", tmp_path / "proc")
    assert [r.status for r in got] == [PASS if os.geteuid() == 0 else SKIP], got


def test_an_unreadable_crontab_is_said_once(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every file; the service user's view needs another uid")
    plant(tmp_path, {"var/spool/cron/crontabs/root": "* * * * * true\n"})
    (tmp_path / "var/spool/cron/crontabs/root").chmod(0)
    got = [r for r in run(tmp_path, Path("/proc")) if r.status == SKIP]
    assert len(got) == 1 and "sudo vllmwatch check" in got[0].detail


@pytest.fixture
def hand_vllm(tmp_path: Path) -> object:
    """A process whose argv is `vllm serve ...` (a Python script named vllm), on GPU 1."""
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nimport signal\nsignal.pause()\n")
    script.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "1"}
    with owned([str(script), "serve", "/data/m", "--port", "8000"], env=env) as proc:
        wait_for(lambda: "serve" in Path(f"/proc/{proc.pid}/cmdline").read_text(), 10,
                 "the hand-started vLLM's argv")
        yield proc


@pytest.mark.parametrize("gpus,warns", [([1], True), ([0, 1], True), (None, True), ([0], False),
                                        ([], False)])
def test_a_hand_started_vllm_on_our_gpus_warns(hand_vllm: subprocess.Popen[bytes],
                                               tmp_path: Path, gpus: object, warns: bool) -> None:
    got = [r for r in run(tmp_path / "empty", Path("/proc"), gpus) if r.status == WARN
           and f"pid {hand_vllm.pid}" in r.name]
    assert bool(got) == warns, got
    if warns:
        assert f"kill {hand_vllm.pid}" in got[0].detail and "vllm serve" in got[0].detail


@pytest.mark.parametrize(("path", "unit"), [
    ("/etc/vllmwatch/gpu1.toml", "vllmwatch@gpu1"), ("/etc/vllmwatch//qa.toml", "vllmwatch@qa"),
    ("/etc/vllmwatch/vllmwatch.toml", "vllmwatch"), ("/srv/vllmwatch.toml", "vllmwatch")])
def test_the_hand_started_vllm_is_stopped_before_the_configs_own_unit_starts(
        hand_vllm: subprocess.Popen[bytes], tmp_path: Path, path: str, unit: str) -> None:
    """The way out names the unit that runs this config (an instance's, by the template's
    rule): `systemctl start vllmwatch` started another unit, or none."""
    got = [r for r in run(tmp_path / "empty", Path("/proc"), [1], path)
           if r.status == WARN and f"pid {hand_vllm.pid}" in r.name]
    assert len(got) == 1 and f"before `systemctl start {unit}`," in got[0].detail, got


def test_check_lists_fights(tmp_path: Path) -> None:
    from vllmwatch.check.runner import CHECKS

    assert "fights" in dict(CHECKS)
    assert shutil.which("true")  # the cron fixture's commands are plain shell
