"""Issue 23 §2: `print-command` refuses a flag that `run` refuses (the same text), instead of
printing a command that would not start."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from vllmwatch import cli
from vllmwatch.config import vllminfo
from vllmwatch.core import exitcodes


@pytest.mark.parametrize("flag,rc", [("max-model-len", 0), ("max-modle-len", exitcodes.CONFIG)])
def test_print_command_refuses_what_run_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str], flag: str,
                                                rc: int) -> None:
    config = tmp_path / "v.toml"
    config.write_text(f'[vllm]\nmodel = "/m"\ncommand = ["{sys.executable}", "-m", "vllm"]\n'
                      f"[vllm.args]\n{flag} = 2048\n")
    cache = tmp_path / "cache"
    monkeypatch.setenv("CACHE_DIRECTORY", str(cache))
    monkeypatch.setattr(vllminfo, "version", lambda command: "0.99.0")
    # The flag list `run` would use, cached as `vllmwatch check` leaves it.
    key = hashlib.sha256(f"0.99.0\0{sys.executable}".encode()).hexdigest()[:16]
    folder = cache / f"vllm-flags-{os.geteuid()}"
    folder.mkdir(parents=True, mode=0o700, exist_ok=True)
    (folder / f"{key}.json").write_text(json.dumps({
        "version": "0.99.0", "flags": ["max-model-len"], "switches": [],
        "kinds": {"max-model-len": "number"}}))
    assert cli.main(["print-command", "-c", str(config)]) == rc
    out, err = capsys.readouterr()
    if rc:
        assert out == "" and "--max-modle-len is not a flag of vLLM 0.99.0" in err
        assert "did you mean max-model-len" in err
    else:
        assert "--max-model-len 2048" in out
