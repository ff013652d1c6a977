"""A NUL byte in vllm.env_file or vllm.api_key_file: `check` built the command and passed,
while the launch's Popen raised ValueError ("embedded null byte") and `run` stopped with
CONFIG. Refused when the file is read, naming the file and line, never the value."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vllmwatch.check import runner
from vllmwatch.config import command
from vllmwatch.config.schema import load


def _config(tmp_path: Path, key: str, text: bytes) -> str:
    secret = tmp_path / "secret"
    secret.write_bytes(text)
    os.chmod(secret, 0o600)
    path = tmp_path / "v.toml"
    path.write_text(f'[vllm]\nmodel = "/m"\ncommand = ["vllm", "serve"]\n{key} = "{secret}"\n')
    return str(path)


@pytest.mark.parametrize("key,text,where", [
    ("env_file", b"# a comment\nHF_TOKEN=hf_a\0b\n", "line 2"),
    ("env_file", b"VLLMWATCH_ARG_API_KEY=k\0\n", "line 1"),
    ("api_key_file", b"sk-\0abc\n", "NUL"),
])
def test_a_nul_byte_in_a_secret_file_is_refused_by_check_and_run(
        tmp_path: Path, key: str, text: bytes, where: str) -> None:
    path = _config(tmp_path, key, text)
    config = load(path)
    with pytest.raises(command.KeyFileError, match=f"vllm.{key}.*{where}") as got:
        command.build(config, {}, api_key=command.read_api_key(config))
    assert not got.value.transient  # a fatal config error, not a rotation to wait out
    assert "hf_a" not in str(got.value) and "sk-" not in str(got.value)
    rows = {r.name: r for r in runner.run(path, fast=True, env={})}
    assert rows["config"].status == runner.FAIL and "NUL" in rows["config"].detail
