"""The unit files themselves: `systemd-analyze verify` silent, exposure low, key settings.

These run without root. `verify` checks that ExecStart= binaries exist, so the units are
verified here with /opt/vllmwatch/bin/vllmwatch replaced by /bin/true; the container tests
verify the installed units unchanged.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from vllmwatch.core import exitcodes

REPO = Path(__file__).resolve().parents[2]
UNITS = ["vllmwatch.service", "vllmwatch@.service"]
MAX_EXPOSURE = 2.0

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                reason="systemd-analyze not installed")


def _copy(unit: str, tmp_path: Path, name: str | None = None) -> Path:
    text = (REPO / "systemd" / unit).read_text()
    path = tmp_path / (name or unit)
    path.write_text(text.replace("/opt/vllmwatch/bin/vllmwatch", "/bin/true"))
    return path


def _settings(unit: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (REPO / "systemd" / unit).read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.mark.parametrize("unit", UNITS)
def test_verify_prints_nothing(unit: str, tmp_path: Path) -> None:
    """verify exits 0 even on misspelt keys, so any output at all is a failure."""
    path = _copy(unit, tmp_path)
    proc = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stdout + proc.stderr == ""


@pytest.mark.parametrize("unit", UNITS)
def test_security_exposure_stays_low(unit: str, tmp_path: Path) -> None:
    """The offline exposure score is in docs/operations/running.md; it must not creep up."""
    path = _copy(unit, tmp_path, unit.replace("@.", "@gpu0."))
    proc = subprocess.run(["systemd-analyze", "security", "--offline=true", str(path)],
                          capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", proc.stdout)
    assert match, proc.stdout + proc.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, proc.stdout
    doc = (REPO / "docs" / "operations" / "running.md").read_text()
    assert f"exposure level {match.group(1)}" in doc, "update the score in operations/running.md"


@pytest.mark.parametrize("unit", UNITS)
def test_key_settings(unit: str) -> None:
    """What the daemon and the GPU rely on; a drift here breaks production, not a test."""
    s = _settings(unit)
    for key, value in {
        "Type": "notify", "NotifyAccess": "main", "KillMode": "mixed", "Restart": "on-failure",
        "User": "vllmwatch", "PrivateDevices": "no",
        "DevicePolicy": "closed", "ProtectSystem": "strict", "CacheDirectory": "vllmwatch",
        "TimeoutStartSec": "120",
    }.items():
        assert s.get(key) == [value], (key, s.get(key))
    assert "char-nvidia* rw" in s["DeviceAllow"]
    # CPU JITs (numba, oneDNN, libffi) need executable memory they wrote: see the unit.
    assert "MemoryDenyWriteExecute" not in s
    # Above the daemon's drain + stop budget (restart.drain_timeout + restart.stop_timeout).
    assert int(s["TimeoutStopSec"][0]) > 30 + 30
    assert int(s["WatchdogSec"][0]) >= 10
    # The exits a restart cannot fix, by their numbers in the one table; sysexits.h codes
    # (64-78), which systemd names by meaning, never LSB's 3-7 (mislabelled by systemd).
    (prevent,) = s["RestartPreventExitStatus"]
    assert sorted(int(c) for c in prevent.split()) == sorted(
        {exitcodes.CONFIG, exitcodes.GPU_FAULT, exitcodes.ALREADY_RUNNING})
    assert {int(c) for c in prevent.split()} == exitcodes.FINAL  # what records say of them
    # A reload checks the config before the signal, so a bad one fails `systemctl reload`.
    assert s["ExecReload"] == [
        "/opt/vllmwatch/bin/vllmwatch check --config-only --config ${VLLMWATCH_CONFIG}",
        "/bin/kill -HUP $MAINPID"]
    # ExecStartPre is advisory: a failing one loops until the start limit (see the unit).
    (pre,) = s["ExecStartPre"]
    assert pre.startswith("-/opt/vllmwatch/bin/vllmwatch check --fast")
    config = "/etc/vllmwatch/%i.toml" if "@" in unit else "/etc/vllmwatch/vllmwatch.toml"
    assert s["Environment"][0] == f"VLLMWATCH_CONFIG={config}"
