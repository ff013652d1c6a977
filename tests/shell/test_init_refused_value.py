"""init comments out a flag whose value vLLM would refuse, naming why, as its header says
("lines that vLLM would refuse are commented out"). Before, only an unknown flag was: with
vLLM 0.32's flag list `--max-model-len=` (an unset $LEN), `--max-num-seqs 1k`, `--dtype
bf16`, `--kv-transfer-config '{"bogus": 1}'` and `--lora-modules a=/x foo` were written
active, and the file init wrote failed its own `check`; with no flag list (`init --fast`,
nothing cached) `max-model-len = ""` was written and passed. And a config class's JSON that
vLLM expands (`80m`) was refused as not JSON: it is written as the number vLLM reads."""

from __future__ import annotations

import pytest
import tomllib

from tests.shell.test_init import init, known
from vllmwatch.config import vllmflags
from vllmwatch.config.schema import from_dict
from vllmwatch.migrate.draft import Facts

KV = '\'{"kv_connector":"X","kv_connector_extra_config":{"cpu_bytes_to_use":80m}}\''


@pytest.mark.parametrize(("words", "flag"), [
    ("--max-model-len=", "max-model-len"), ("--max-model-len ''", "max-model-len"),
    ("--max-num-seqs 1k", "max-num-seqs"), ("--dtype bf16", "dtype"),
    ("--gpu-memory-utilization nan", "gpu-memory-utilization"),
    ("--lora-modules foo", "lora-modules"), ("--lora-modules a=/x foo", "lora-modules"),
    ("--cudagraph-capture-sizes 1 x 4", "cudagraph-capture-sizes"),  # (each word is read)
    ("--kv-transfer-config '{\"bogus\": 1}'", "kv-transfer-config")])
def test_a_value_vllm_refuses_is_commented_out_and_named(words: str, flag: str) -> None:
    vllm, toml, draft = init(f"vllm serve /m {words} --enforce-eager", Facts(known=known()))
    assert flag not in vllm.get("args", {}), toml
    assert vllm["args"]["enforce-eager"] is True
    assert any(e.startswith(words.split()[0].split("=")[0]) and f"--{flag}" in e
               for e in draft.errors), draft.errors
    assert f"# {flag} = " in toml or f"# {flag} (dropped)" in toml, toml
    # the file init wrote passes the check `run` makes
    assert vllmflags.validate_args(from_dict(tomllib.loads(toml)), known()) == []


@pytest.mark.parametrize(("words", "args"), [
    ("--max-model-len 32k", {"max-model-len": "32k"}), ("--dtype bfloat16", {"dtype": "bfloat16"}),
    ("--chat-template=", {"chat-template": ""}),  # (str?: "" is vLLM's "no value")
    ("--max-num-seqs 8", {"max-num-seqs": 8}),
    (f"--kv-transfer-config {KV}", {"kv-transfer-config": {
        "kv_connector": "X", "kv_connector_extra_config": {"cpu_bytes_to_use": 80000000}}})])
def test_a_value_vllm_takes_is_written(words: str, args: dict[str, object]) -> None:
    vllm, toml, draft = init(f"vllm serve /m {words}", Facts(known=known()))
    assert vllm.get("args") == args and not draft.errors, (toml, draft.errors)


@pytest.mark.parametrize("flag", ["max-model-len", "gpu-memory-utilization", "seed"])
def test_with_no_flag_list_an_empty_value_is_not_written(flag: str) -> None:
    vllm, toml, draft = init(f"vllm serve /m --{flag}=", Facts())
    assert flag not in vllm.get("args", {}), toml
    assert any("an empty value" in e and f"{flag} = VALUE" in e for e in draft.errors), \
        draft.errors
