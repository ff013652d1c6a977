"""The API key or the hub token given in two places: one silently won (vllm.api_key_file
over [vllm.env] VLLM_API_KEY), and the clients holding the other key got 401. Now the
config is refused naming both places, at load for what the TOML holds and at the launch for
vllm.env_file; and a problem about a secret-named key reads whole after the redactor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vllmwatch.config import command
from vllmwatch.config.errors import Problem
from vllmwatch.config.redact import REDACT
from vllmwatch.config.schema import ConfigError, from_dict


def _config(tmp_path: Path, vllm: dict[str, Any]) -> dict[str, Any]:
    key = tmp_path / "key"
    key.write_text("k-file\n")
    key.chmod(0o600)
    table = {k: (str(key) if v == "KEYFILE" else v) for k, v in vllm.items()}
    return {"vllm": {"model": "/m", **table}}


@pytest.mark.parametrize(("vllm", "second", "first"), [
    ({"api_key_file": "KEYFILE", "env": {"VLLM_API_KEY": "k-env"}}, "vllm.env.VLLM_API_KEY",
     "vllm.api_key_file"),
    ({"api_key_file": "KEYFILE", "extra_args": ["--api-key", "k2"]}, "vllm.extra_args",
     "vllm.api_key_file"),
    ({"args": {"api-key": "k1"}, "env": {"VLLM_API_KEY": "k2"}}, "vllm.env.VLLM_API_KEY",
     "vllm.args.api-key"),
    ({"args": {"api_key": "k1"}, "extra_args": ["--api-key=k2"]}, "vllm.extra_args",
     "vllm.args.api-key"),
    ({"args": {"hf-token": "hf_x"}, "env": {"HF_TOKEN": "hf_y"}}, "vllm.env.HF_TOKEN",
     "vllm.args.hf-token"),
])
def test_a_key_set_in_two_places_is_refused_naming_both(tmp_path: Path, vllm: dict[str, Any],
                                                        second: str, first: str) -> None:
    with pytest.raises(ConfigError) as got:
        from_dict(_config(tmp_path, vllm))
    problem = next(p for p in got.value.problems if "a second time" in p.problem)
    assert problem.key == second and f"(also {first})" in problem.problem
    said = str(got.value)  # what check, print-command and the journal show
    assert REDACT.text(said) == said and f"{second}` sets " in said.replace(":", "`"), said


@pytest.mark.parametrize("value", [["k1", "k2"], True, 7])
def test_an_api_key_that_is_not_one_text_is_refused(tmp_path: Path, value: object) -> None:
    """`api-key = ["k1", "k2"]` became the JSON text as the key; `true` a bare --api-key."""
    with pytest.raises(ConfigError, match="takes one key as text"):
        from_dict(_config(tmp_path, {"args": {"api-key": value}}))


def test_a_bare_hf_token_beside_the_variable_is_one_token(tmp_path: Path) -> None:
    from_dict(_config(tmp_path, {"args": {"hf-token": True}, "env": {"HF_TOKEN": "hf_y"}}))


@pytest.mark.parametrize("line", ["VLLM_API_KEY=k-env", "VLLMWATCH_ARG_API_KEY=k-env"])
def test_the_env_file_setting_the_key_again_is_refused_at_the_launch(tmp_path: Path,
                                                                     line: str) -> None:
    env_file = tmp_path / "secrets.env"
    env_file.write_text(line + "\n")
    env_file.chmod(0o600)
    config = from_dict(_config(tmp_path, {"api_key_file": "KEYFILE",
                                          "env_file": str(env_file)}))
    with pytest.raises(ConfigError, match="a second time") as got:
        command.build(config, {}, api_key=command.read_api_key(config))
    assert "k-env" not in str(got.value) and "k-file" not in str(got.value)


@pytest.mark.parametrize("key", ["vllm.env.HF_TOKEN", "vllm.args.api-key",
                                 "vllm.env_file: VLLM_API_KEY", "vllm.env.DB_PASSWORD"])
def test_a_problem_about_a_secret_named_key_reads_whole_after_the_redactor(key: str) -> None:
    """`vllm.env.HF_TOKEN: sets ...` came out `vllm.env.HF_TOKEN: <redacted> ...`, and
    `vllm.env.HF_TOKEN sets HF_TOKEN a second time` as `vllm.env.HF_TOKEN <redacted> HF_TOKEN`
    (a lower-case word before a name read as the name's value)."""
    for problem in ("sets it a second time; keep one", "sets HF_TOKEN a second time",
                    "takes one key as text", "must be text, not 7", "overrides VLLM_API_KEY"):
        text = Problem(key, problem, 3).render("/etc/v.toml")
        assert REDACT.text(text) == text and problem in text, text
