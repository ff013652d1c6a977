"""The arm64 .deb (DGX Spark is aarch64): a cross build from this machine whose venv holds
only aarch64 or pure-Python code, and `vllmwatch check` from it in an arm64 Debian root
file system under qemu-user (packaging/arm64-check.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EM_AARCH64, EM_X86_64 = 183, 62
_NO_INDEX = ("Could not find a version", "No matching distribution", "NewConnectionError",
             "Temporary failure in name resolution", "Network is unreachable")


@pytest.fixture(scope="module")
def arm64_deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb not installed (apt-get install dpkg)")
    out = tmp_path_factory.mktemp("deb-arm64")
    env = {**os.environ, "VLLMWATCH_DEB_ARCH": "arm64", "VLLMWATCH_DEB_OUT": str(out),
           "VLLMWATCH_DEB_BUILD": str(tmp_path_factory.mktemp("deb-arm64-build"))}
    proc = subprocess.run([str(REPO / "packaging" / "build-deb.sh")], env=env, text=True,
                          capture_output=True, timeout=900)
    if proc.returncode != 0 and any(s in proc.stderr for s in _NO_INDEX):
        pytest.skip("no package index with aarch64 wheels reachable: "
                    + proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, f"build-deb.sh failed:\n{proc.stdout}\n{proc.stderr}"
    [deb] = sorted(out.glob("vllmwatch_*_arm64.deb"))
    return deb


def _elf_machine(path: Path) -> int | None:
    with path.open("rb") as f:
        head = f.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    return int.from_bytes(head[18:20], "little")


def test_arm64_package_holds_only_aarch64_code(arm64_deb: Path, tmp_path: Path) -> None:
    arch = subprocess.run(["dpkg-deb", "-f", str(arm64_deb), "Architecture"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert arch == "arm64"
    subprocess.run(["dpkg-deb", "-x", str(arm64_deb), str(tmp_path)], check=True)
    venv = tmp_path / "opt" / "vllmwatch" / "venv"
    machines = {p.relative_to(tmp_path): _elf_machine(p) for p in venv.rglob("*")
                if p.is_file() and not p.is_symlink()}
    elves = {p: m for p, m in machines.items() if m is not None}
    assert elves, "no compiled extension at all (psutil has one): the venv looks wrong"
    assert all(m == EM_AARCH64 for m in elves.values()), elves
    # The wheels pip chose: binary ones are tagged for aarch64, the rest are pure Python.
    site = next(venv.glob("lib/python3*/site-packages"))
    tags = {w.parent.name: [line.split(": ", 1)[1] for line in w.read_text().splitlines()
                            if line.startswith("Tag: ")]
            for w in site.glob("*.dist-info/WHEEL")}
    assert any(n.startswith("psutil-") for n in tags)
    for name, wheel_tags in tags.items():
        assert all(t.endswith("-any") or "aarch64" in t for t in wheel_tags), (name, wheel_tags)
    script = (venv / "bin" / "vllmwatch").read_text()
    assert script.startswith("#!/opt/vllmwatch/venv/bin/python\n")
    assert os.readlink(venv / "bin" / "python3") == "/usr/bin/python3"


def test_vllmwatch_check_runs_in_an_arm64_root_under_qemu(arm64_deb: Path,
                                                          tmp_path: Path) -> None:
    missing = [t for t in ("qemu-aarch64-static", "debootstrap", "unshare", "chroot")
               if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (scripts/test.sh installs "
                    "qemu-user-static and debootstrap as root)")
    if os.geteuid() != 0:
        pytest.skip("chroot and the /proc bind mount need root")
    config = tmp_path / "spark.toml"
    config.write_text('[vllm]\nmodel = "/srv/models/none"\ncommand = ["/usr/bin/true"]\n'
                      '[memory]\nunified = true\n')
    rootfs = Path(os.environ.get("VLLMWATCH_TEST_ARM64_ROOTFS", tmp_path / "rootfs"))
    proc = subprocess.run([str(REPO / "packaging" / "arm64-check.sh"), str(arm64_deb),
                           str(rootfs), str(config)], capture_output=True, text=True,
                          timeout=900)
    if proc.returncode == 3:
        pytest.skip(f"debootstrap could not fetch an arm64 Debian: {proc.stderr[-300:]}")
    out = proc.stdout
    assert "machine=aarch64" in out, proc.stdout + proc.stderr
    assert "Traceback" not in out + proc.stderr
    assert "PASS  platform               unified memory (config)" in out, out
    assert "unified.kv-cache" in out and "passed," in out
    assert proc.returncode == 1  # the model path does not exist there: a FAIL line, not a crash
