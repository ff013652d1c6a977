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


def test_only_the_env_files_credential_like_values_are_hidden_in_every_line(
        tmp_path: Path) -> None:
    """Every value of vllm.env_file was learnt (554186c), and a learnt value is cut out of
    every line: `VLLM_LOGGING_LEVEL=INFO` there turned each of vLLM's lines into
    `<redacted> 12-06 ...` in the journal and the records, `HF_HOME=/var/cache/hf` every path
    under it, and `VLLM_RPC_TIMEOUT=100000` print-command's `--max-model-len 100000`. A value
    under a name that says nothing is hidden only when it reads as a credential."""
    from vllmwatch.config.redact import Redactor

    path = _config(tmp_path, "env_file", b"HF_TOKEN=hf_a1\nGH_PAT=Gp5ZpatValue\n"
                   b"OTHER=correcthorsebatterystaple\nVLLM_LOGGING_LEVEL=INFO\n"
                   b"HF_HOME=/var/cache/hf\nVLLM_RPC_TIMEOUT=100000\nHOST_IP=10.0.0.5\n"
                   b"NCCL_SOCKET_IFNAME=eth0\nVLLM_ATTENTION_BACKEND=FLASH_ATTN\n")
    with open(path, "a") as f:
        f.write('[vllm.args]\nmax-model-len = 100000\n')
    cmd = command.build(load(path), {})
    assert cmd.hidden == {"hf_a1", "Gp5ZpatValue", "correcthorsebatterystaple"}
    line = ("INFO 12-06 06:00:00 [api_server.py:1] weights from /var/cache/hf/hub on 10.0.0.5 "
            "with eth0, FLASH_ATTN, max_model_len=100000; GH_PAT is Gp5ZpatValue")
    assert Redactor(cmd.hidden, known=False).text(line) == line.replace(
        "Gp5ZpatValue", "<redacted>")
    assert "--max-model-len 100000" in cmd.display()


def test_settings_of_short_words_joined_stay_readable_and_credentials_do_not(
        tmp_path: Path) -> None:
    """An EnvironmentFile moved over as vllm.env_file holds settings beside its secrets: a
    hub mirror, NCCL's interfaces, a locale, a CUDA arch list, a usage tag. Each was learnt
    as a credential (8 characters or more, mixed), so vLLM's lines read `404 Client Error for
    url: <redacted>/api/models/...` and `NCCL INFO NET/IB : Using [0]<redacted>`."""
    from vllmwatch.config.redact import Redactor

    settings = {"HF_ENDPOINT": "https://hf-mirror.com", "NCCL_IB_HCA": "mlx5_0,mlx5_1",
                "LANG": "en_US.UTF-8", "TORCH_CUDA_ARCH_LIST": "8.0 9.0+PTX",
                "VLLM_USAGE_SOURCE": "production-docker-image", "TZ": "Europe/Berlin",
                "NCCL_SOCKET_IFNAME": "^docker0,lo", "SERVED": "meta-llama/Llama-3.1-8B-Instruct",
                "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    credentials = {"GH_PAT": "Gp5ZpatValue", "OTHER": "correcthorsebatterystaple",
                   "HOOK": "https://hooks.slack.com/services/T0AB/B0CD/Xk29dLq0pZaB7cD8eF9g",
                   "DB": "postgres://u:pw1234@db/x", "AWS": "wJalrXUtnFEMI/K7MDENG/bPxRfiCY",
                   "HEX": "0123456789abcdef0123456789abcdef", "GPU": "GPU-8f3a2b1c-1234-5678"}
    lines = "".join(f"{k}={v}\n" for k, v in {**settings, **credentials}.items())
    cmd = command.build(load(_config(tmp_path, "env_file", lines.encode())), {})
    assert cmd.hidden == set(credentials.values())
    line = ("HfHubHTTPError: 404 Client Error for url: https://hf-mirror.com/api/models/x; "
            "NCCL INFO NET/IB : Using [0]mlx5_0,mlx5_1; TZ Europe/Berlin")
    assert Redactor(cmd.hidden, known=False).text(line) == line
