"""Flags every vLLM refuses, judged before a launch even when the installed vLLM's flag list
cannot be learnt (no vLLM yet, `check --fast`, an ask that timed out): a name that is not
lowercase words joined by - (`"API-KEY" = "..."`, `Max-Model-Len`), and a value flag given
`false` (`--no-hf-token`) or bare (`max-model-len = true`). Before, these passed the built-in
check and vLLM refused every start (a crash loop; the key on vLLM's command line)."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.shell.test_init import known
from vllmwatch.config import flagnames, flags
from vllmwatch.config.command import build
from vllmwatch.config.schema import ConfigError, from_dict

VALUE_TAKERS = sorted(flagnames.TAKES_VALUE | flags.BUILTIN_JSON)


def load(args: dict[str, object] | None = None, extra: list[str] | None = None) -> object:
    """The launch's command as `run`, `check` and print-command build it (ConfigError)."""
    vllm: dict[str, object] = {"model": "/m", "args": args or {}, "extra_args": extra or []}
    return build(from_dict({"vllm": vllm}), {})


def refusal(args: dict[str, object] | None = None, extra: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        load(args, extra)
    return str(err.value)


def test_no_flag_of_a_real_vllm_is_refused_by_the_shape_rules() -> None:
    """The rules are checked against vLLM 0.32.0's own parser: each of its flags, as a
    switch either way or with a value, as its kind takes it."""
    real = known()
    assert len(real.flags) > 100
    for name in real.flags:
        if real.kind(name) == "bool":
            assert flagnames.shape_problem(name, True, "k") is None, name
            assert flagnames.shape_problem(name, False, "k") is None, name
        else:
            assert flagnames.shape_problem(name, "x", "k", flags.BUILTIN_JSON) is None, name
    # and every flag the rules call a value flag takes a value there (device: gone in 0.32)
    assert sorted(n for n in VALUE_TAKERS if real.kind(n) in (None, "bool")) == ["device"]


@given(st.text(alphabet=string.ascii_letters + string.digits + "-_ .:/+", min_size=1,
               max_size=20).filter(lambda s: s[0] not in "-_" and "." not in s))
def test_a_name_that_is_not_lowercase_words_is_refused_with_the_flag_it_meant(
        name: str) -> None:
    head = flags.flag_name(name)
    problem = flagnames.shape_problem(head, 1, f"vllm.args.{name}")
    if head == flagnames.spelled(head):
        assert problem is None  # (max_model_len: vLLM's own spelling after the _ -> -)
        return
    assert problem is not None and problem.key == f"vllm.args.{name}"
    assert f"--{head} is not a vLLM flag" in problem.problem
    mean = flagnames.spelled(head)
    assert problem.problem.endswith(f"; write {mean}" if mean else "; remove it")


@pytest.mark.parametrize("key,meant", [("API-KEY", "api-key"), ("Max-Model-Len", "max-model-len"),
                                       ("O", "optimization-level"), ("tp", None)])
def test_a_config_with_such_a_key_is_refused_naming_the_key(key: str, meant: str | None
                                                            ) -> None:
    if meant is None:  # lowercase and unknown: only vLLM's own list can tell
        load({key: 2})
        return
    said = refusal({key: "Zq7secretValue9" if "KEY" in key else 2})
    assert f"vllm.args.{key}" in said and f"write {meant}" in said
    assert "Zq7secretValue9" not in said


@pytest.mark.parametrize("name", VALUE_TAKERS)
def test_a_value_flag_has_no_false_and_no_bare_form(name: str) -> None:
    if name in flags.OWNED_FLAGS or name in flags.REMOVED or name == "api-key":
        return  # (refused by their own words: set by vllmwatch, gone, one key as text)
    assert f"--no-{name}, which vLLM refuses" in refusal({name: False})
    assert f"--no-{name} is not a vLLM flag" in refusal({f"no-{name}": True})
    assert f"--no-{name} is not a vLLM flag" in refusal(extra=[f"--no-{name}"])
    if name in flagnames.BARE_OK:
        load({name: True})  # --hf-token alone: the token huggingface_hub stored
    else:
        assert f"--{name} with no value, which vLLM refuses" in refusal({name: True})


def test_switches_keep_both_forms() -> None:
    load({"enforce-eager": False, "enable-prefix-caching": True,
          "hf-overrides.Rope_Type": "yarn"})  # (after the dot: a JSON key, any spelling)


@pytest.mark.parametrize("extra", [["--Max-Model-Len", "64"], ["--max-model-len=64", "--Seed"],
                                   ["-tp", "1", "--API_KEY=abc"]])
def test_extra_args_are_judged_alike(extra: list[str]) -> None:
    assert "is not a vLLM flag" in refusal(extra=extra)


@pytest.mark.parametrize("flag", ["--api-key", "--api-k", "--hf-token", "--api_key"])
def test_the_word_after_a_bare_secret_flag_is_never_named(flag: str) -> None:
    """`--api-key --Zq7...`: argparse reads the key as a flag, but it is a key; the new name
    rule must not say it (`--Zq7... is not a vLLM flag`)."""
    for extra in ([flag, "--Zq7dashKey9"], [flag, "--Zq7dashKey9", "--max-model-len", "64"]):
        try:
            load(extra=extra)
        except ConfigError as exc:
            assert "Zq7dashKey9" not in str(exc) and "zq7dashkey9" not in str(exc)
