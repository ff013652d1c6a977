"""`pip install -U vllm` under a running vllmwatch: the version (and with it the flags that
are checked, `--shutdown-timeout`, the start-up cache variables) was read once per command
for the daemon's life, so every launch after the upgrade was judged as the old vLLM's. The
next launch now reads it again when vLLM's package file changed since the read.

A real venv (no pip) with a stand-in vllm package and its metadata: the probe is the real
one (`python -I`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import TIMEOUT_SCALE
from vllmwatch.config import vllminfo
from vllmwatch.shell.versions import VersionCache


def _install(site: Path, version: str) -> None:
    """What pip leaves: the package's files written anew, the old dist-info replaced."""
    for old in site.glob("vllm-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    pkg = site / "vllm"
    pkg.mkdir(exist_ok=True)
    init = pkg / "__init__.py"
    init.unlink(missing_ok=True)
    init.write_text(f"__version__ = {version!r}\n")
    meta = site / f"vllm-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")


def test_a_vllm_reinstalled_under_the_daemon_is_read_again_at_the_next_launch(
        tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120 * TIMEOUT_SCALE)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-I", "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True,
                               timeout=60 * TIMEOUT_SCALE).stdout.strip())
    _install(site, "0.26.0")
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server"]
    vllminfo.forget()
    cache = VersionCache()
    try:
        assert cache.of(cmd) == "0.26.0"
        assert cache.of(cmd) == "0.26.0"  # unchanged: not read again
        _install(site, "0.32.0")
        assert cache.of(cmd) == "0.32.0"
        assert cache.info.version == "0.32.0"
    finally:
        vllminfo.forget()  # other tests' interpreters are read afresh
