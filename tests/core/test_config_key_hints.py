"""An unknown key's message: the right hint, and a long name cut without showing a secret.

The review of 2026-12-07: `env-file` below [vllm] was told both "did you mean vllm.env_file?"
and "a vLLM flag goes under [vllm.args]", which then refused it as a key of [vllm]; the hint
repeated a 300 kB name whole; and a secret pasted as a long key showed its first part, cut
where the redactor could no longer tell it was one.
"""

from __future__ import annotations

import pytest

from vllmwatch.config.redact import REDACT
from vllmwatch.config.schema import ConfigError, from_dict

TOKEN = "hf_Zq7Kx9Lm2Pw4Rt6Yu8Io0Pa3Sd5FgHj"


def _said(data: dict[str, object]) -> str:
    with pytest.raises(ConfigError) as err:
        from_dict(data)
    return REDACT.text(str(err.value))  # as every command prints it


@pytest.mark.parametrize(("written", "meant"), [
    ("env-file", "env_file"), ("api-key-file", "api_key_file"), ("extra-args", "extra_args"),
    ("Served-Model-Name", "served_model_name"), ("API_KEY_FILE", "api_key_file")])
def test_a_vllm_key_by_another_spelling_is_named_not_sent_to_vllm_args(
        written: str, meant: str) -> None:
    said = _said({"vllm": {"model": "/m", written: "/x"}})
    assert f"did you mean vllm.{meant}?" in said and "[vllm.args]" not in said, said


@pytest.mark.parametrize("flag", ["max-model-len", "gpu-memory-utilization", "enforce-eager"])
def test_a_vllm_flag_below_vllm_is_sent_to_vllm_args(flag: str) -> None:
    said = _said({"vllm": {"model": "/m", flag: 1}})
    assert f"[vllm.args]: {flag} = ..." in said, said


@pytest.mark.parametrize("section", ["vllm", "probe", "restart"])
def test_a_long_key_is_cut_and_a_secret_in_it_never_shows(section: str) -> None:
    for pad in (90, 100, 110, 118):  # the token across the cut at 120, each way
        key = "a" * pad + " " + TOKEN  # (a token is one word: glued to others it is none)
        table: dict[str, object] = {key: 1, **({"model": "/m"} if section == "vllm" else {})}
        said = _said({"vllm": {"model": "/m"}, section: table} if section != "vllm"
                     else {"vllm": table})
        assert TOKEN[3:11] not in said, (pad, said)
        assert len(said) < 1500, len(said)
        huge = _said({"vllm": {"model": "/m", "b" * 300_000: 1}})
        assert len(huge) < 1500 and "(300000 characters)" in huge, len(huge)
