"""What an operator feeds vllmwatch, from a hostile review of the config and the CLI
(2026-12-07), each as its class:

- an unknown key of any table ([SECTION], [[smoke]], [[adapters]]) names the key it most
  likely meant, whatever its case or its `-`/`_` (`MAX_RESTARTS`, `[VLLM]`, `Endpoint`), and
  a vLLM flag written right below [vllm] says it goes under [vllm.args]."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from vllmwatch.config import adapters, smoke
from vllmwatch.config.schema import SECTIONS, ConfigError, from_dict


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
