"""A switch in vllm.command before the model is no switch given a value: vLLM's parser reads
the word after a switch as a positional, so `vllm serve --enforce-eager /m` serves /m (and
`vllm serve --enforce-eager --model /m` serves it too). The value rules without vLLM's flag
list (config/flagnames.py) read that model as --enforce-eager's value, and the load refused a
config vLLM serves ("--enforce-eager is a switch ... and '/m' is one"); another model there is
named as one, once."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllmwatch import cli
from vllmwatch.config import flags
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
