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


@pytest.mark.parametrize("key,text,name", [
    # NAME="value" as a shell, a .env or systemd's EnvironmentFile= is written: the quotes
    # reached vLLM in the value (an API key vLLM and our probes took with its quotes, while
    # every client got 401; a hub token refused)
    ("env_file", b'VLLM_API_KEY="sk-abc"\n', "VLLM_API_KEY"),
    ("env_file", b"# token\nHF_TOKEN='hf_abc'\n", "HF_TOKEN"),
    ("env_file", b'VLLMWATCH_ARG_OTLP_TRACES_ENDPOINT="https://u:pw@h"\n',
     "VLLMWATCH_ARG_OTLP_TRACES_ENDPOINT"),
    ("api_key_file", b'"sk-abc"\n', "in quotes"),
])
def test_a_value_in_quotes_in_a_secret_file_is_refused_naming_it_not_its_value(
        tmp_path: Path, key: str, text: bytes, name: str) -> None:
    path = _config(tmp_path, key, text)
    config = load(path)
    with pytest.raises(command.ConfigError, match=f"vllm.{key}.*{name}") as got:
        command.build(config, {}, api_key=command.read_api_key(config))
    assert "remove" in str(got.value) and "quotes" in str(got.value)
    assert all(s not in str(got.value) for s in ("sk-abc", "hf_abc", "pw@h"))
    rows = {r.name: r for r in runner.run(path, fast=True, env={})}
    assert rows["config"].status == runner.FAIL and "quotes" in rows["config"].detail
    with pytest.raises(command.ConfigError, match="quotes"):  # and a reload refuses it
        command.load_for_reload(path)


@pytest.mark.parametrize("text", [b"HF_TOKEN=hf_a\"b\"\n", b'HF_TOKEN="\n', b"HF_TOKEN=''x\n"])
def test_a_quote_inside_a_value_is_the_values_own(tmp_path: Path, text: bytes) -> None:
    config = load(_config(tmp_path, "env_file", text))
    command.build(config, {}, api_key=None)
