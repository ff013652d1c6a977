"""Pure tables: when a standby is wanted, when EngineCore starts by fork (issue 28)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllmwatch.config.command import build
from vllmwatch.config.launch import (
    FORK_VARIABLE,
    STANDBY_ROOM_MIB,
    engine_start_method,
    parallel_sizes,
    standby_wanted,
)
from vllmwatch.config.schema import ConfigError, from_dict


@pytest.mark.parametrize(("setting", "gpu", "unified", "avail", "on", "words"), [
    ("false", True, False, 1e6, False, "standby = false"),
    ("true", False, True, 10.0, True, "standby = true"),  # forced: even CPU, unified, tight
    ("auto", True, False, 1e6, True, "discrete GPU"),
    ("auto", True, False, None, True, "discrete GPU"),  # MemAvailable unknown: not a veto
    ("auto", False, False, 1e6, False, "CPU config"),
    ("auto", True, True, 1e6, False, "unified memory"),
    ("auto", True, False, STANDBY_ROOM_MIB - 1, False, "leaves no room"),
])
def test_wanted(setting: str, gpu: bool, unified: bool, avail: float | None, on: bool,
                words: str) -> None:
    got, why = standby_wanted(setting, gpu, unified, avail)
    assert got is on and words in why


@pytest.mark.parametrize(("args", "extra", "sizes"), [
    ({}, [], {"tp": 1, "pp": 1, "dp": 1}),
    ({"tensor-parallel-size": 2}, [], {"tp": 2, "pp": 1, "dp": 1}),
    ({"tensor_parallel_size": 4}, [], {"tp": 4, "pp": 1, "dp": 1}),
    ({}, ["-tp", "2"], {"tp": 2, "pp": 1, "dp": 1}),
    ({}, ["--tensor-parallel-size=8", "--pipeline-parallel-size", "2"],
     {"tp": 8, "pp": 2, "dp": 1}),
    ({"data-parallel-size": 2}, [], {"tp": 1, "pp": 1, "dp": 2}),
    ({"tensor-parallel-size": "x"}, [], {"tp": 1, "pp": 1, "dp": 1}),  # vLLM will refuse it
])
def test_parallel_sizes(args: dict[str, object], extra: list[str], sizes: dict[str, int]
                        ) -> None:
    assert parallel_sizes(args, extra) == sizes


@pytest.mark.parametrize(("args", "env", "method", "words"), [
    ({}, {}, "fork", "one worker"),
    ({"tensor-parallel-size": 2}, {}, None, "vLLM's choice"),
    ({"pipeline-parallel-size": 2}, {}, None, "vLLM's choice"),
    ({}, {FORK_VARIABLE: "spawn"}, None, "set by the operator"),
])
def test_engine_start_method(args: dict[str, object], env: dict[str, str], method: str | None,
                             words: str) -> None:
    got, why = engine_start_method(args, [], env)
    assert got == method and words in why


def _cmd_env(vllm: dict[str, object], base: dict[str, str] | None = None) -> dict[str, str]:
    config = from_dict({"vllm": {"model": "/m", "gpus": [0], **vllm}})
    return dict(build(config, base or {"PATH": "/usr/bin"}).env)


def test_the_launch_gets_fork_for_tp1_and_leaves_tp2_and_the_operator_alone() -> None:
    assert _cmd_env({})[FORK_VARIABLE] == "fork"
    assert FORK_VARIABLE not in _cmd_env({"args": {"tensor-parallel-size": 2}, "gpus": [0, 1]})
    assert _cmd_env({"env": {FORK_VARIABLE: "spawn"}})[FORK_VARIABLE] == "spawn"
    assert _cmd_env({}, {"PATH": "/usr/bin", FORK_VARIABLE: "spawn"})[FORK_VARIABLE] == "spawn"


@pytest.mark.parametrize("line", ["VLLMWATCH_ARG_TENSOR_PARALLEL_SIZE=2",
                                  "VLLMWATCH_ARG_PIPELINE_PARALLEL_SIZE=4"])
def test_a_parallel_size_from_the_env_file_leaves_vllm_its_choice(tmp_path: Path,
                                                                   line: str) -> None:
    """vllm.env_file may carry flag values: a parallel size there was not seen, and a TP=2
    launch got EngineCore by fork (the hostile review of the config)."""
    env_file = tmp_path / "secrets.env"
    env_file.write_text(line + "\n")
    assert FORK_VARIABLE not in _cmd_env({"env_file": str(env_file)})


@pytest.mark.parametrize("name", ["PORT", "MODEL", "POR", "DEVICE"])
def test_a_flag_the_launch_refuses_is_refused_from_the_env_file_too(tmp_path: Path,
                                                                    name: str) -> None:
    env_file = tmp_path / "secrets.env"
    env_file.write_text(f"VLLMWATCH_ARG_{name}=sekrit-value\n")
    with pytest.raises(ConfigError) as err:
        _cmd_env({"env_file": str(env_file)})
    assert f"VLLMWATCH_ARG_{name}" in str(err.value)
    assert "sekrit-value" not in str(err.value), "a value of the env file was shown"
