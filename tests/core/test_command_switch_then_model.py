"""A switch in vllm.command before the model is no switch given a value: vLLM's parser reads
the word after a switch as a positional, so `vllm serve --enforce-eager /m` serves /m (and
`vllm serve --enforce-eager --model /m` serves it too). The value rules without vLLM's flag
list (config/flagnames.py) read that model as --enforce-eager's value, and the load refused a
config vLLM serves ("--enforce-eager is a switch ... and '/m' is one"); another model there is
named as one, once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.shell.test_init import known
from vllmwatch import cli
from vllmwatch.config import flags, vllmflags
from vllmwatch.config.schema import from_dict
from vllmwatch.core import exitcodes

SERVED = [
    ["vllm", "serve", "--enforce-eager", "/m"],
    ["vllm", "serve", "--enforce-eager", "--model", "/m"],
    ["vllm", "serve", "--trust-remote-code", "--enable-prefix-caching", "/m", "--seed", "1"],
]


@pytest.mark.parametrize("command", SERVED)
def test_the_model_after_a_switch_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         command: list[str]) -> None:
    assert flags.command_problems(command, "/m") == []
    path = tmp_path / "a.toml"
    words = ", ".join(f'"{w}"' for w in ["/nonexistent/bin/vllm", *command[1:]])
    path.write_text(f'[vllm]\nmodel = "/m"\ncommand = [{words}]\n')
    assert cli.main(["print-command", "-c", str(path)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("command", [["vllm", "serve", "--enforce-eager", "/other"],
                                     ["vllm", "serve", "/m", "--trust-remote-code", "/other"]])
def test_another_model_after_a_switch_is_named_once(command: list[str]) -> None:
    problems = flags.command_problems(command, "/m")
    assert [p.key for p in problems] == [f"vllm.command[{len(command) - 1}]"], problems
    assert "is a model to vLLM" in problems[0].problem


def test_a_switch_joined_to_a_value_is_still_refused(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "a.toml"
    path.write_text('[vllm]\nmodel = "/m"\n'
                    'command = ["/nonexistent/bin/vllm", "serve", "--enforce-eager=1", "/m"]\n')
    assert cli.main(["print-command", "-c", str(path)]) == exitcodes.CONFIG
    assert "vllm.command[2]" in capsys.readouterr().err


# Where vLLM's flag list is known, the same: it read the model after a flag's value as a word
# more for that flag ("'/m' follow a flag that takes one value"), and after a switch as the
# switch's value, so `run` refused to start what vLLM 0.32 serves.
@pytest.mark.parametrize("command", [*SERVED, ["vllm", "serve", "--max-model-len", "4096", "/m"],
                                     ["vllm", "serve", "--dtype", "half", "/m", "--seed", "1"]])
def test_the_flag_list_passes_it_too(command: list[str]) -> None:
    config = from_dict({"vllm": {"model": "/m", "command": command}})
    assert vllmflags.validate_args(config, known()) == []


@pytest.mark.parametrize(("command", "key"), [
    (["vllm", "serve", "--max-model-len", "4096", "x", "/m"], "vllm.command[2]"),
    (["vllm", "serve", "/m", "--max-model-len", "4k", "x"], "vllm.command[3]"),
    (["vllm", "serve", "--max-model-len", "/m"], "vllm.command[2]")])
def test_the_flag_list_still_refuses_the_words_around_it(command: list[str], key: str) -> None:
    config = from_dict({"vllm": {"model": "/m"}})
    config = dataclasses.replace(config, vllm=dataclasses.replace(config.vllm,
                                                                  command=tuple(command)))
    assert [p.key for p in vllmflags.validate_args(config, known())] == [key]
