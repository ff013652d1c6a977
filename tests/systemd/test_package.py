"""The .deb: builds from the repo, lintian clean, and holds what the units need."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def _contents(deb: Path) -> list[str]:
    out = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True,
                         check=True).stdout
    return [line.split()[5].lstrip(".") for line in out.splitlines()]


def test_lintian_clean(deb: Path) -> None:
    """No error or warning; each override is explained in packaging/lintian-overrides."""
    if shutil.which("lintian") is None:
        pytest.skip("lintian not installed (apt-get install lintian)")
    proc = subprocess.run(["lintian", "--pedantic", "-I", str(deb)], capture_output=True,
                          text=True, timeout=600)
    tags = [line for line in (proc.stdout + proc.stderr).splitlines()
            if line[:2] in ("E:", "W:", "I:", "P:", "X:")]
    assert tags == [], "\n".join(tags)


def test_contents(deb: Path) -> None:
    """Units, sysusers, conffile, the venv's entry point; no bytecode, no build paths."""
    files = _contents(deb)
    for path in ("/lib/systemd/system/vllmwatch.service",
                 "/lib/systemd/system/vllmwatch@.service",
                 "/usr/lib/sysusers.d/vllmwatch.conf", "/etc/vllmwatch/vllmwatch.toml",
                 "/opt/vllmwatch/bin/vllmwatch", "/opt/vllmwatch/venv/bin/vllmwatch",
                 "/usr/bin/vllmwatch", "/usr/share/doc/vllmwatch/copyright",
                 "/usr/lib/systemd/catalog/vllmwatch.catalog"):
        assert path in files, path
    assert any(f.endswith("/site-packages/vllmwatch/cli.py") for f in files)
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    conffiles = subprocess.run(["dpkg-deb", "-f", str(deb), "Package"], capture_output=True,
                               text=True, check=True).stdout.strip()
    assert conffiles == "vllmwatch"
    info = subprocess.run(["dpkg-deb", "--info", str(deb), "conffiles"], capture_output=True,
                          text=True, check=True).stdout.split()
    assert info == ["/etc/vllmwatch/vllmwatch.toml"]


def test_shipped_config_is_the_repos(deb: Path, tmp_path: Path) -> None:
    """etc/vllmwatch.toml goes in as is."""
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    repo = Path(__file__).resolve().parents[2]
    shipped = (tmp_path / "etc" / "vllmwatch" / "vllmwatch.toml").read_bytes()
    assert shipped == (repo / "etc" / "vllmwatch.toml").read_bytes()
    script = (tmp_path / "opt" / "vllmwatch" / "venv" / "bin" / "vllmwatch").read_text()
    assert script.startswith("#!/opt/vllmwatch/venv/bin/python\n")


def test_the_test_fakes_are_not_shipped(deb: Path, tmp_path: Path) -> None:
    """vllmwatch/testing/ (fakes, harnesses) stays in the source tree: not in `dpkg -c`, and
    not in the wheel's RECORD either (pip would list files that are not there)."""
    files = _contents(deb)
    assert any("/site-packages/vllmwatch/" in f for f in files), "no vllmwatch in the .deb?"
    assert [f for f in files if "/vllmwatch/testing" in f] == []
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    records = list(tmp_path.glob("opt/vllmwatch/venv/lib/python3*/site-packages/"
                                 "vllmwatch-*.dist-info/RECORD"))
    assert len(records) == 1, records
    record = records[0].read_text()
    assert "vllmwatch/cli.py" in record
    assert "vllmwatch/testing/" not in record
