"""A number word past a float's range (400 digits, or 1e400 after its suffix: `1...1k`) is
judged like any other, never an OverflowError's traceback: `print-command` and the daemon's
load died on `max-model-len = "1000...0"` (flagnames._reads: math.isfinite of a 400-digit
int), and vLLM's own flag list died on `--max-model-len 1...1k` (units.vllm_read: int() of
float inf). vLLM stops on the second (its int(float(...) * 1000) raises OverflowError,
which argparse does not catch), so it is refused; the first is a whole number to int()."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.shell.test_init import known
from vllmwatch import cli
from vllmwatch.config import flagnames, units, vllmflags
from vllmwatch.config.schema import from_dict
from vllmwatch.core import exitcodes

HUGE = "1" + "0" * 400  # (a TOML integer of this size loads too)
PAST = "1" * 400 + "k"  # float("1...1") is inf: int(inf * 1000) in vLLM


@pytest.mark.parametrize(("word", "refused"), [(HUGE, False), (PAST, True),
                                               ("1" * 300 + "t", True), ("25.6k", False)])
def test_the_built_in_rules_judge_it(word: str, refused: bool) -> None:
    assert (flagnames.value_problem("max-model-len", word, "k") is not None) == refused
    if not refused:
        return
    with pytest.raises(ValueError):
        units.vllm_read("hr_int", word)
    with pytest.raises(ValueError):
        units.vllm_read("whole", word)


def test_the_flag_list_refuses_it() -> None:
    config = from_dict({"vllm": {"model": "/m"}})
    config = dataclasses.replace(config, vllm=dataclasses.replace(
        config.vllm, extra_args=("--max-model-len", PAST)))
    assert vllmflags.validate_args(config, known())


@pytest.mark.parametrize("value", [f'"{HUGE}"', HUGE, f'"{PAST}"'])
def test_print_command_says_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               value: str) -> None:
    path = tmp_path / "a.toml"
    path.write_text('[vllm]\nmodel = "/m"\ncommand = ["/nonexistent/bin/vllm", "serve"]\n'
                    f"[vllm.args]\nmax-model-len = {value}\n")
    code = cli.main(["print-command", "-c", str(path)])
    err = capsys.readouterr().err
    assert "Traceback" not in err and code in (0, exitcodes.CONFIG), err
    assert (code == exitcodes.CONFIG) == (PAST in value), err
