"""What an operator feeds vllmwatch, from a hostile review of the config and the CLI
(2026-12-07), each as its class:

- an unknown key of any table ([SECTION], [[smoke]], [[adapters]]) names the key it most
  likely meant, whatever its case or its `-`/`_` (`MAX_RESTARTS`, `[VLLM]`, `Endpoint`), and
  a vLLM flag written right below [vllm] says it goes under [vllm.args];
- a config path that is not UTF-8 is a config error at the load, not exit 70 at `run`'s
  instance lock (nor `check`'s "cannot load: UnicodeEncodeError") after the load passed."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from vllmwatch import cli
from vllmwatch.config import adapters, smoke
from vllmwatch.config.schema import SECTIONS, ConfigError, from_dict, load
from vllmwatch.core import exitcodes


def _spellings(key: str) -> list[str]:
    """What a person writes for `key`: another case, dashes, one letter left out."""
    out = {key.upper(), key.capitalize(), key.replace("_", "-"), key[:-2] + key[-1]}
    return sorted(s for s in out if s != key)


def _cases() -> list[tuple[str, str, str]]:
    """(table, known key, how it was written) for every key of every table."""
    cases = [(s, f.name, w) for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)
             for w in _spellings(f.name)]
    cases += [("smoke", k, w) for k in smoke.KEYS if k != "endpoint" for w in _spellings(k)]
    cases += [("adapters", k, w) for k in adapters.KEYS for w in _spellings(k)]
    return cases


def _problems(data: dict[str, Any]) -> dict[str, str]:
    data.setdefault("vllm", {}).setdefault("model", "/m")
    with pytest.raises(ConfigError) as exc:
        from_dict(data)
    return {p.key: p.problem for p in exc.value.problems}


@pytest.mark.parametrize(("table", "key", "written"), _cases())
def test_an_unknown_key_of_any_table_names_the_key_it_spells(table: str, key: str,
                                                             written: str) -> None:
    if table == "smoke":
        data: dict[str, Any] = {"smoke": [{"endpoint": "chat", written: 1}]}
        at = "smoke[1]."
    elif table == "adapters":
        data = {"adapters": [{"name": "a", "path": "/a", written: 1}]}
        at = "adapters[1]."
    else:
        data = {table: {written: 1}}
        at = f"{table}."
    problem = _problems(data)[at + written]
    assert problem.startswith(f"unknown key; did you mean {at}{key}?"), problem


@pytest.mark.parametrize("section", ["VLLM", "Probe", "MEMORY", "Restart"])
def test_an_unknown_section_names_the_section_in_any_case(section: str) -> None:
    problem = _problems({section: {}})[section]
    assert problem == f"unknown section; did you mean {section.lower()}?", problem


@pytest.mark.parametrize("flag", ["max-model-len", "tensor_parallel_size", "enforce-eager",
                                  "api-key"])
def test_a_vllm_flag_right_below_vllm_says_it_goes_under_vllm_args(flag: str) -> None:
    problem = _problems({"vllm": {"model": "/m", flag: 1}})[f"vllm.{flag}"]
    assert problem.startswith("unknown key; ") and \
        f"a vLLM flag goes under [vllm.args]: {flag} = ..." in problem, problem


def test_a_key_of_vllm_in_another_case_is_no_flag() -> None:
    problem = _problems({"vllm": {"model": "/m", "PORT": 1}})["vllm.PORT"]
    assert problem == "unknown key; did you mean vllm.port?", problem


def _not_utf8(tmp_path: Path, where: str) -> str:
    base = os.fsencode(tmp_path)
    path = base + (b"/caf\xe9.toml" if where == "file" else b"/\xff\xfe/vllmwatch.toml")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(b'[vllm]\nmodel = "/m"\n')
    return os.fsdecode(path)  # as argv and the environment give it: surrogate escapes


@pytest.mark.parametrize("where", ["file", "folder"])
@pytest.mark.parametrize("given", ["--config", "VLLMWATCH_CONFIG"])
@pytest.mark.parametrize("sub", [["print-command"], ["check", "--config-only"],
                                 ["check", "--fast"], ["prewarm"]])
def test_a_config_path_that_is_not_utf8_is_a_config_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        where: str, given: str, sub: list[str]) -> None:
    path = _not_utf8(tmp_path, where)
    with pytest.raises(ConfigError, match="is not UTF-8 text; rename the file"):
        load(path)
    if given == "--config":
        argv = [*sub, "--config", path]
    else:
        monkeypatch.setenv("VLLMWATCH_CONFIG", path)
        argv = sub
    assert cli.main(argv) == exitcodes.CONFIG
    out = capsys.readouterr()
    said = out.out + out.err
    assert "not UTF-8 text" in said and "Error" not in said and "Traceback" not in said, said
