"""vllm.env_file's entries get the checks [vllm.args] and [vllm.env] get: a flag it gives that
[vllm.args] or extra_args sets too (vLLM took the env file's, vllmwatch read the table's), a
variable [vllm.env] sets too (the env file's won, unseen: both shown <redacted>), and
VLLM_HTTP_TIMEOUT_KEEP_ALIVE that is not a whole number (vLLM stops its start on it) all
passed `check` and reached vLLM. Now `check --config-only` and the launch refuse them, naming
the variable, never the env file's value (it holds secrets)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vllmwatch.config import command
from vllmwatch.config.schema import ConfigError, from_dict
from vllmwatch.shell import childrun

VALUE = "S3cretV4lue9"  # every env file value here: never in a message


def _config(tmp_path: Path, lines: list[str], **vllm: Any) -> Any:
    env_file = tmp_path / "vllm.env"
    env_file.write_text("".join(f"{line.replace('@', VALUE)}\n" for line in lines))
    env_file.chmod(0o600)
    return from_dict({"vllm": {"model": "/m", "gpus": [], "env_file": str(env_file),
                               **vllm, "env": {"TMPDIR": str(tmp_path), **vllm.get("env", {})}}})


REFUSED = [  # (env file lines, [vllm] keys, the key named, words of the problem)
    (["VLLMWATCH_ARG_MAX_MODEL_LEN=@"], {"args": {"max_model_len": 4096}},
     "vllm.env_file: VLLMWATCH_ARG_MAX_MODEL_LEN", "set by vllm.args.max_model_len too"),
    (["VLLMWATCH_ARG_MAX_MODEL_LEN=@"], {"extra_args": ["--max-model-len", "4096"]},
     "vllm.env_file: VLLMWATCH_ARG_MAX_MODEL_LEN", "set by vllm.extra_args[0] too"),
    (["VLLMWATCH_ARG_TENSOR_PARALLEL_SIZE=@"], {"extra_args": ["--enforce-eager", "-tp", "2"]},
     "vllm.env_file: VLLMWATCH_ARG_TENSOR_PARALLEL_SIZE", "set by vllm.extra_args[1] too"),
    (["VLLM_LOGGING_LEVEL=@"], {"env": {"VLLM_LOGGING_LEVEL": "INFO"}},
     "vllm.env_file: VLLM_LOGGING_LEVEL", "set in [vllm.env] too"),
    (["VLLM_HTTP_TIMEOUT_KEEP_ALIVE=5@"], {},
     "vllm.env_file: VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "not a whole number"),
]


@pytest.mark.parametrize("lines,vllm,key,words", REFUSED)
def test_check_and_the_launch_refuse_it(tmp_path: Path, lines: list[str],
                                        vllm: dict[str, Any], key: str, words: str) -> None:
    config = _config(tmp_path, lines, **vllm)
    with pytest.raises(ConfigError) as got:  # what `check` and check --config-only run
        command.build(config, {}, api_key=command.read_api_key(config))
    said = str(got.value)
    assert f"{key}: " in said and words in said and VALUE not in said, said
    launch = childrun.prepare(config, {"PATH": "/usr/bin:/bin"}, "0123456789abcdef", None,
                              {}, lambda *a, **k: None)
    assert isinstance(launch, childrun.SpawnFailed) and launch.fatal, launch
    assert key in launch.error and VALUE not in launch.error


def test_only_what_is_twice_is_refused(tmp_path: Path) -> None:
    """A flag vLLM appends (--middleware) may repeat in the file and beside extra_args, as
    init writes it; other variables and flags once each, and a whole number, are not named."""
    config = _config(tmp_path, ["VLLMWATCH_ARG_MIDDLEWARE=a.@", "VLLMWATCH_ARG_MIDDLEWARE=b.@",
                                "VLLMWATCH_ARG_OTLP_TRACES_ENDPOINT=http://u:@@h",
                                "VLLM_HTTP_TIMEOUT_KEEP_ALIVE= 7", "DATABASE_URL=@",
                                "VLLMWATCH_ARG_DTYPE=@"],
                     args={"max-model-len": 4096}, env={"VLLM_LOGGING_LEVEL": "INFO"},
                     extra_args=["--middleware", "c.m", "--dtype", "half"])
    with pytest.raises(ConfigError) as got:
        command.build(config, {}, api_key=None)
    assert [p.key for p in got.value.problems] == ["vllm.env_file: VLLMWATCH_ARG_DTYPE"], \
        str(got.value)
