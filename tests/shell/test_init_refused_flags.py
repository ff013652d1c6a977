"""init's one rule for a flag of the line that vLLM would refuse (migrate/refusals.py): it is
dropped, never the line. The flag is written commented out with a comment naming it, why
vLLM refuses it and what to write; an `error:` line says the same; the rest is migrated and
init exits 0, with vLLM's flag list and without it (the shape rules of config/flagnames).
Before, a wrong-case flag (`--Max-Model-Len 4096`) or the `--no-` form of a value flag
(`--no-hf-token`) made the whole line refused with no list, while a bare value flag was
dropped; with the list, a bare number flag refused the line. The exception, where nothing is
written: a refused form of the API key, the port, the host, the model or the served name
with a value meant (dropped, the config would serve every client with no key, or on another
address or name). A secret is never printed nor written, whatever the flag's spelling."""

from __future__ import annotations

import io
import sys
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.shell.test_init import known
from vllmwatch.config import flags, serveline, vllmflags
from vllmwatch.config.flagnames import VALUE_FLAGS
from vllmwatch.config.schema import from_dict
from vllmwatch.migrate import deliver, render, translate
from vllmwatch.migrate.draft import Facts

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LISTS = pytest.mark.parametrize("listed", [False, True], ids=["no-flag-list", "vllm-0.32"])


def migrate(line: str, listed: bool) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `init --stdout` for one line, as deliver runs it (its
    load test and the checks a reload makes), without the machine's own `check`."""
    facts = Facts(known=known() if listed else None)
    draft = translate.translate(serveline.parse(serveline.split_text(line)), facts)
    out, err = io.StringIO(), io.StringIO()
    how = deliver.Out("/tmp/vw-test/vllmwatch.toml", True, False, False)
    with mock.patch.object(deliver, "_check", lambda *a: None):
        rc = deliver.deliver(how, render.render(draft, "test"), draft, facts, out, err)
    return rc, out.getvalue(), err.getvalue()


def assert_dropped(line: str, listed: bool, key: str, named: str) -> str:
    """The flag `key` is dropped with a comment and an error naming `named`; the rest kept."""
    rc, toml, err = migrate(f"vllm serve /m {line} --enforce-eager --max-num-seqs 4", listed)
    assert rc == 0 and "nothing written" not in err, err
    data = tomllib.loads(toml)
    from_dict(data)
    args = data["vllm"]["args"]
    assert key not in args and args["enforce-eager"] is True and args["max-num-seqs"] == 4, toml
    assert f"# {render.key(key)} " in toml, toml  # commented out: `# k (dropped)` or `# k = v`
    assert f"the line had `{named}" in toml, toml
    assert any(e.startswith(f"error: `{named}") for e in err.splitlines()), err
    assert flags.args_problems(args, data["vllm"].get("extra_args", [])) == []
    if listed:
        assert vllmflags.validate_args(from_dict(data), known()) == []
    return toml


WRONG_CASE = ["--Max-Model-Len 4096", "--MAX-NUM-BATCHED-TOKENS=8192", "--Enforce-Eager",
              "--DTYPE auto", "--Trust_Remote_Code", "--Seed 7", "--GPU-Memory-Utilization 0.9",
              "--Compilation-Config 3"]


@LISTS
@pytest.mark.parametrize("words", WRONG_CASE)
def test_a_wrong_case_flag_is_dropped_not_the_line(words: str, listed: bool) -> None:
    flag = words.split()[0].split("=")[0]
    toml = assert_dropped(words, listed, serveline_name(flag), flag)
    assert "lowercase" in toml and f"`--{serveline_name(flag).lower()}`" in toml, toml


def serveline_name(flag: str) -> str:
    return flag[2:].replace("_", "-")


NEGATED = ["max-model-len", "hf-token", "dtype", "seed", "compilation-config",
           "gpu-memory-utilization", "port", "host", "api-key"]


@LISTS
@pytest.mark.parametrize("flag", NEGATED)
def test_the_no_form_of_a_value_flag_is_dropped_not_the_line(flag: str, listed: bool) -> None:
    assert_dropped(f"--no-{flag}", listed, f"no-{flag}", f"--no-{flag}")
    _, _, err = migrate(f"vllm serve /m --no-{flag}", listed)
    assert "only switches have a `--no-` form" in err, err


BARE = ["max-model-len", "gpu-memory-utilization", "compilation-config", "seed",
        "tensor-parallel-size", "max-num-batched-tokens", "hf-overrides"]


@LISTS
@pytest.mark.parametrize("last", [False, True], ids=["before-a-flag", "last"])
@pytest.mark.parametrize("flag", BARE)
def test_a_bare_value_flag_is_dropped_not_the_line(flag: str, listed: bool, last: bool) -> None:
    line = f"--enforce-eager --max-num-seqs 4 --{flag}" if last else f"--{flag}"
    toml = assert_dropped(line, listed, flag, f"--{flag}")
    assert "no value on the line" in toml, toml


@LISTS
@pytest.mark.parametrize("words", ["--max-model-len true", "--seed False",
                                   "--gpu-memory-utilization TRUE",
                                   "--max-num-batched-tokens=false"])
def test_a_switchs_word_for_a_value_flag_is_dropped(words: str, listed: bool) -> None:
    flag = words.split()[0].split("=")[0]
    assert_dropped(words, listed, flag[2:], words.split()[0] if "=" not in words else words)


@pytest.mark.parametrize("words", ["--enforce-eager=foo", "--trust-remote-code=yes",
                                   "--disable-log-stats=1"])
def test_a_value_given_to_a_switch_is_dropped(words: str) -> None:
    """With vLLM's list a switch is known (without it `--enforce-eager=foo` is a text flag)."""
    flag = words.split("=")[0][2:]
    rc, toml, err = migrate(f"vllm serve /m {words} --max-num-seqs 4", True)
    assert rc == 0 and flag not in tomllib.loads(toml)["vllm"]["args"], toml
    assert f"# {flag} = true" in toml and "is a switch and takes no value" in err, err


@LISTS
@pytest.mark.parametrize("words", ["--disable-log-requests", "--device cuda",
                                   "--disable-logprobs-during-spec-decoding"])
def test_a_flag_removed_from_vllm_is_dropped(words: str, listed: bool) -> None:
    rc, toml, err = migrate(f"vllm serve /m {words} --max-num-seqs 4", listed)
    name = words.split()[0][2:]
    assert rc == 0 and f"# {name} (dropped)" in toml and "max-num-seqs = 4" in toml, err


@pytest.mark.parametrize("words", ["--bogus-flag 3", "--max-modle-len 4096", "--api-keys K9x",
                                   "--my-token=Zq9secret"])
def test_an_unknown_flag_is_dropped_and_its_secret_value_never_shown(words: str) -> None:
    rc, toml, err = migrate(f"vllm serve /m {words} --max-num-seqs 4", True)
    assert rc == 0 and "max-num-seqs = 4" in toml, err
    if "K9x" in words or "Zq9" in words:
        assert "K9x" not in toml + err and "Zq9secret" not in toml + err, toml + err
        assert "its value not shown" in toml, toml


@LISTS
@pytest.mark.parametrize("words", ["--max-model-len 1024 --max-model-len 2048",
                                   "--seed 1 --seed=2"])
def test_a_repeated_flag_keeps_the_last_as_vllm_does(words: str, listed: bool) -> None:
    rc, toml, err = migrate(f"vllm serve /m {words}", listed)
    assert rc == 0 and "the last counts" in toml, err


CLIENT = ["--API-KEY Zq9k3y77", "--Api-Key=Zq9k3y77", "--api_KEY Zq9k3y77", "--PORT 8001",
          "--Host 127.0.0.1", "--Served-Model-Name chat", "--MODEL /m2", "--port",
          "--host", "--served-model-name", "--port true"]


@LISTS
@pytest.mark.parametrize("words", CLIENT)
def test_how_clients_reach_the_server_is_never_guessed(words: str, listed: bool) -> None:
    """Dropped, these would serve with no key, on another port or interface, or under another
    name: nothing is written, and the key is never shown."""
    rc, out, err = migrate(f"vllm serve /m --max-num-seqs 4 {words}", listed)
    assert rc == 2 and out == "" and "nothing written" in err, err
    assert "without it the config would serve" in err and "Zq9k3y77" not in err, err


_CASED = st.tuples(st.sampled_from(sorted(flags.SECRET_FLAGS)), st.integers(1, 2**8 - 1))


def _spell(flag: str, mask: int) -> str:
    out = "".join(c.upper() if mask >> (i % 8) & 1 else c for i, c in enumerate(flag))
    return out if out != flag else flag.upper()


@settings(max_examples=120, deadline=None)
@given(_CASED, st.text("abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789_.",
                       min_size=8, max_size=24), st.booleans(), st.booleans())
def test_a_secret_under_any_spelling_is_never_printed_nor_written(
        cased: tuple[str, int], key: str, joined: bool, listed: bool) -> None:
    flag = _spell(*cased)
    secret = f"Zq9{key}"
    words = f"--{flag}={secret}" if joined else f"--{flag} {secret}"
    rc, out, err = migrate(f"vllm serve /m {words} --max-num-seqs 4", listed)
    assert secret not in out + err, (words, out + err)
    assert (rc == 2) == (cased[0] == "api-key"), err  # the key: nothing written


@LISTS
@pytest.mark.parametrize("form", ["bare", "no", "case", "true"])
@pytest.mark.parametrize("flag", sorted(VALUE_FLAGS - {"model", "host", "device"}))
def test_every_refused_form_of_a_value_flag_leaves_a_config_that_loads(
        flag: str, form: str, listed: bool) -> None:
    """Whatever the form, the rest of the line is written and the file passes the load and the
    checks a reload makes (init never writes what its own load refuses)."""
    words = {"bare": f"--{flag}", "no": f"--no-{flag}", "case": f"--{flag.upper()} 8",
             "true": f"--{flag} true"}[form]
    rc, toml, err = migrate(f"vllm serve /m {words} --enforce-eager", listed)
    assert rc == 0, err
    args = tomllib.loads(toml)["vllm"]["args"]
    assert args.get("enforce-eager") is True and flags.args_problems(args, []) == [], toml
    assert any(e.startswith("error: ") and f"--{flag}" in e.lower() for e in err.splitlines()), err


@pytest.mark.parametrize("word", ["foo", "/m2", "sk-Zq9abcdefghijklmnop"])
def test_a_word_after_a_switch_is_dropped_with_a_comment(word: str) -> None:
    """With vLLM's list, `--enforce-eager foo` leaves `foo` to no flag (the model is given):
    vLLM refused the line; the word is dropped with a comment, a secret-looking one unshown."""
    rc, toml, err = migrate(f"vllm serve /m --enforce-eager {word} --max-num-seqs 4", True)
    assert rc == 0 and "enforce-eager = true" in toml and "max-num-seqs = 4" in toml, err
    assert "follows no flag" in toml and "follows no flag" in err, toml
    assert ("Zq9" not in toml + err) if "Zq9" in word else f"'{word}'" in toml, toml + err
