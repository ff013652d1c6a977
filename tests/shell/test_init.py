"""`vllmwatch init` from a command line: a guide's whole `vllm serve` line becomes a config
that loads, that vLLM 0.32.0 (its real flag list, in fixtures/) accepts, and that says in a
comment what it changed; the parsing rules one table row each."""

from __future__ import annotations

import io
import json
import os
import shlex
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllmwatch import cli
from vllmwatch.config import serveline, vllmflags
from vllmwatch.config.schema import from_dict
from vllmwatch.migrate import render, runner, translate
from vllmwatch.migrate.draft import Facts

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GUIDE = (FIXTURES / "guide-qwen35-9b.txt").read_text()
SECRET = "sk-guide-0123456789abcdef"


def known() -> vllmflags.FlagSet:
    """vLLM 0.32.0's flags as its own parser reported them (vllmflags' probe, cache format)."""
    data = json.loads((FIXTURES / "vllm-0.32.0-flags.json").read_text())
    return vllmflags.FlagSet(data["version"], frozenset(data["flags"]),
                             frozenset(data["switches"]), data["kinds"], data["aliases"],
                             frozenset(data["lists"]), frozenset(data["integers"]),
                             {k: tuple(v) for k, v in data["choices"].items()},
                             data["parsers"], {k: tuple(v) for k, v in data["fields"].items()})


def init(text: str, facts: Facts | None = None) -> tuple[dict[str, Any], str, translate.Draft]:
    """(the [vllm] table as loaded, the TOML text, the draft) for one command line."""
    line = serveline.parse(serveline.split_text(text))
    draft = translate.translate(line, facts or Facts(known=known()))
    toml = render.render(draft, "test")
    data = tomllib.loads(toml)
    from_dict(data)  # loads as a vllmwatch config
    return data["vllm"], toml, draft


def comment_before(toml: str, line: str) -> str:
    """The comment lines right above a line of the file."""
    lines = toml.splitlines()
    i = lines.index(line)
    above = []
    while i > 0 and lines[i - 1].startswith("# "):
        i -= 1
        above.insert(0, lines[i][2:])
    return " ".join(above)


# The guide's flags that init changes or drops, and a word the comment must carry.
GUIDE_CHANGES = [
    ("gpus = []", "--device cpu"),
    ('api_key_file = "/etc/vllmwatch/api-key"', "`--api-key` and its value"),
    ('hf-overrides = { rope_parameters = { rope_type = "dynamic", factor = 4.0 } }',
     "--rope-scaling {type:dynamic,factor:4.0}"),
    ("enforce-eager = false", "--enforce-eager False"),
    ("trust-remote-code = true", "--trust-remote-code True"),
    ('kv-cache-dtype = "auto"', "--kv-cache-dtype fp16"),
    ("# disable-logprobs-during-spec-decoding (dropped)", "removed"),
    ("# disable-log-requests (dropped)", "enable-log-requests"),
    ("# max-modle-len = 4096", "did you mean max-model-len"),
]


def test_the_guides_whole_line_becomes_a_config_vllm_accepts() -> None:
    vllm, toml, draft = init(GUIDE)
    assert vllm["model"] == "/data/models/qwen35-9b" and vllm["port"] == 8000
    assert vllm["served_model_name"] == "qwen35-9b" and vllm["host"] == "0.0.0.0"
    assert vllm["env"] == {"HF_HOME": "/data/hf-cache", "VLLM_LOGGING_LEVEL": "INFO"}
    args = vllm["args"]
    assert args["tensor-parallel-size"] == 2 and args["gpu-memory-utilization"] == 0.92
    assert args["max-num-batched-tokens"] == 8192 and args["optimization-level"] == "3"
    assert args["speculative-config"] == {"method": "ngram", "num_speculative_tokens": 4}
    assert args["chat-template"].startswith("{% for m in messages %}")  # text stays text
    assert "extra_args" not in vllm
    for line, word in GUIDE_CHANGES:
        assert word in comment_before(toml, line), (line, comment_before(toml, line))
    assert draft.changed >= len(GUIDE_CHANGES)
    assert SECRET not in toml
    assert [e for e in draft.errors if "max-modle-len" in e], draft.errors
    config = from_dict(tomllib.loads(toml))
    assert vllmflags.validate_args(config, known()) == []  # `run` would accept every flag


ROWS: list[tuple[str, str, dict[str, Any]]] = [
    ("quoted value with spaces",
     "vllm serve m --chat-template '{% if x %}a b{% endif %}'",
     {"chat-template": "{% if x %}a b{% endif %}"}),
    ("backslash continuations in one string",
     "vllm serve m \\\n  --max-num-seqs 8 \\\n  --seed 3", {"max-num-seqs": 8, "seed": 3}),
    ("--flag=value", "vllm serve m --max-model-len=4096 --dtype=bfloat16",
     {"max-model-len": 4096, "dtype": "bfloat16"}),
    ("repeated flag: the last counts", "vllm serve m --max-num-seqs 1 --max-num-seqs 2",
     {"max-num-seqs": 2}),
    ("short flags", "vllm serve m -tp 2 -pp=2 -O3", {"tensor-parallel-size": 2,
                                                    "pipeline-parallel-size": 2,
                                                    "optimization-level": "3"}),
    ("a JSON flag as the shell's brace expansion split it",
     "vllm serve m --hf-overrides a:1 b:2", {"hf-overrides": {"a": 1, "b": 2}}),
    ("JSON-ish with single quotes and True",  # (keys of vLLM 0.32's CompilationConfig)
     "vllm serve m --compilation-config \"{'mode': 3, 'cudagraph_copy_inputs': True}\"",
     {"compilation-config": {"mode": 3, "cudagraph_copy_inputs": True}}),
    ("a dotted JSON field", "vllm serve m --compilation-config.mode 3",
     {"compilation-config.mode": 3}),
    ("a bare switch", "vllm serve m --enable-prefix-caching", {"enable-prefix-caching": True}),
    ("a switch turned off", "vllm serve m --enable-prefix-caching False",
     {"enable-prefix-caching": False}),
    ("--model and python -m", "python3 -m vllm.entrypoints.openai.api_server --model m --seed 1",
     {"seed": 1}),
]


@pytest.mark.parametrize("text,want", [(t, w) for _, t, w in ROWS], ids=[r[0] for r in ROWS])
def test_command_line_forms(text: str, want: dict[str, Any]) -> None:
    vllm, _, draft = init(text)
    assert vllm["model"] == "m"
    assert {k: vllm["args"].get(k) for k in want} == want, (vllm["args"], draft.errors)


def test_unknown_flags_are_errors_with_a_did_you_mean_and_commented_out() -> None:
    vllm, toml, draft = init("vllm serve m --max-model-length 4096 --gpu-mem-util 0.9")
    assert "max-model-length" not in vllm["args"]
    assert "# max-model-length = 4096" in toml and "# gpu-mem-util = 0.9" in toml
    assert any("did you mean max-model-len" in e for e in draft.errors), draft.errors
    assert len(draft.errors) == 2


def test_without_vllms_flag_list_kinds_are_guessed_and_json_is_only_for_json_flags() -> None:
    vllm, _, _ = init("vllm serve m --seed 7 --gpu-memory-utilization 0.5 --dtype half "
                      "--hf-overrides {a:1} --chat-template {{x}}", Facts())
    assert vllm["args"] == {"seed": 7, "gpu-memory-utilization": 0.5, "dtype": "half",
                            "hf-overrides": {"a": 1}, "chat-template": "{{x}}"}


@pytest.mark.parametrize("env,gpus,passed", [
    ("CUDA_VISIBLE_DEVICES=2,3", [2, 3], None),
    ("CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb", [1, 0], None),  # UUIDs NVML knows
    ("CUDA_VISIBLE_DEVICES=MIG-1111", None, "MIG-1111"),  # MIG: passed as it was
    ("CUDA_VISIBLE_DEVICES=", [], None),
])
def test_gpus_from_cuda_visible_devices(env: str, gpus: list[int] | None,
                                        passed: str | None) -> None:
    facts = Facts(known=known(), gpu_index={"GPU-aaaa": 1, "GPU-bbbb": 0})
    vllm, _, _ = init(f"{env} vllm serve m", facts)
    assert vllm.get("gpus") == gpus
    assert vllm.get("env", {}).get("CUDA_VISIBLE_DEVICES") == passed


def test_secrets_are_never_written_to_the_toml() -> None:
    vllm, toml, draft = init("HF_TOKEN=hf_abcdef VLLM_API_KEY=k1 MY_PASSWORD=p1 vllm serve m "
                             "--hf-token hf_ghijkl")
    for secret in ("hf_abcdef", "hf_ghijkl", "k1", "p1"):
        assert f'"{secret}"' not in toml and f" {secret}" not in toml
    assert vllm["api_key_file"] and vllm["env_file"] and "env" not in vllm
    # Moved, not masked (issue 37.1): init writes them where the TOML points.
    assert draft.api_key == "k1"
    assert draft.secret_env == {"HF_TOKEN": "hf_ghijkl", "MY_PASSWORD": "p1"}  # the flag wins


def test_cli_writes_0640_refuses_to_overwrite_and_prints_with_stdout(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "vllmwatch.toml"
    words = ["--", "vllm", "serve", "/srv/m", "--port", "8123", "--api-key", SECRET]
    err = io.StringIO()
    req = runner.Request(words, None, str(path), fast=True)
    assert runner.main(req, os.environ, out=io.StringIO(), err=err) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    if os.geteuid() == 0:
        assert path.stat().st_uid == 0
    assert SECRET not in path.read_text() and SECRET not in err.getvalue()
    assert tomllib.loads(path.read_text())["vllm"]["port"] == 8123
    before = path.read_text()
    assert runner.main(req, os.environ, out=io.StringIO(), err=io.StringIO()) == 2
    assert path.read_text() == before  # never overwritten without --force
    out = io.StringIO()
    cli_rc = cli.main(["init", "-c", str(path), "--stdout", "--fast",
                       "vllm serve /srv/other --port 8124"])
    assert cli_rc == 0 and path.read_text() == before
    req2 = runner.Request(["vllm serve /srv/other --port 8124"], None, str(path), stdout=True,
                          fast=True)
    assert runner.main(req2, os.environ, out=out, err=io.StringIO()) == 0
    assert tomllib.loads(out.getvalue())["vllm"]["model"] == "/srv/other"
    forced = runner.Request(["vllm serve /srv/other"], None, str(path), force=True, fast=True)
    assert runner.main(forced, os.environ, out=io.StringIO(), err=io.StringIO()) == 0
    assert "/srv/other" in path.read_text()


def test_a_line_without_vllm_is_refused() -> None:
    err = io.StringIO()
    req = runner.Request(["python3 train.py --lr 3"], None, "/nonexistent/x.toml", stdout=True)
    assert runner.main(req, os.environ, out=io.StringIO(), err=err) == 2
    assert "no `vllm serve`" in err.getvalue()


# ---- what vLLM receives is what the line gave it (the hostile pass: a revision "0123" became
# 123, "1.10" became 1.1, and a JSON null became "" when vLLM's flag list was unknown) ----

def _argv_of(vllm: dict[str, Any]) -> list[str]:
    from vllmwatch.config.command import args_to_argv
    return args_to_argv(vllm.get("args", {})) + list(vllm.get("extra_args", []))


@settings(max_examples=150, deadline=None)
@given(st.from_regex(r"[+-]?(0|[0-9]{1,4})(\.[0-9]{1,3})?([eE][+-]?[0-9]{1,2})?",
                     fullmatch=True))
def test_a_number_like_text_reaches_vllm_as_the_line_had_it(text: str) -> None:
    """Typed by its looks (no flag list): a number only where TOML writes it back the same.
    (A flag of config/flagnames' tables, --seed, is judged by every vLLM's reader: 1.5 is
    no seed; --some-number is one no table names.)"""
    vllm, _, _ = init(f"vllm serve m --revision {text} --some-number {text}", Facts())
    argv = _argv_of(vllm)
    assert _value(argv, "--revision") == text, (vllm, argv)
    assert _value(argv, "--some-number") == text, (vllm, argv)


def _value(argv: list[str], flag: str) -> str:
    """A flag's value in argv: the next word, or after = (a word that starts with - is
    joined to its flag: vLLM reads -1.5 alone as a flag, flags.loose_negative)."""
    i = next(i for i, w in enumerate(argv) if w == flag or w.startswith(f"{flag}="))
    return argv[i + 1] if argv[i] == flag else argv[i].partition("=")[2]


@pytest.mark.parametrize("flag,json_text", [
    ("hf-overrides", '{"rope_scaling": null}'),
    ("hf-overrides", '{"a": {"b": [1, null]}}'),
    ("speculative-config", '{"method": null, "num_speculative_tokens": 3}'),
])
def test_a_json_null_is_kept_as_json_not_turned_into_an_empty_string(
        flag: str, json_text: str) -> None:
    for facts in (Facts(), Facts(known=known())):
        vllm, _, draft = init(f"vllm serve m --{flag} '{json_text}'", facts)
        argv = _argv_of(vllm)
        assert json.loads(argv[argv.index(f"--{flag}") + 1]) == json.loads(json_text), argv
        assert any("null" in said for said in draft.said), draft.said


@pytest.mark.parametrize("value", [">gpt", "<s>{{ messages }}</s>", "<|im_start|>", "2>x",
                                   "|", "&", ";"])
def test_a_value_the_shell_would_not_act_on_is_kept(value: str) -> None:
    """A quoted word that looks like a redirection or an operator is literal to the shell,
    and so to vLLM: init dropped `'>gpt'` and `'<s>...'` as redirections (and made the flag
    a bare switch). Unquoted, the shell's own words go; argv (from /proc, or split by the
    shell after `init --`) is what vLLM received, every word literal."""
    for quote in ("'", '"'):
        text = (f"vllm serve /m --served-model-name {quote}{value}{quote} --port 8001 "
                "> /var/log/vllm.log 2>&1 &")
        line = serveline.parse(serveline.split_text(text))
        assert line.rest == ["/m", "--served-model-name", value, "--port", "8001"], line
    argv = ["vllm", "serve", "/m", "--served-model-name", value, "--port", "8001"]
    assert serveline.parse(argv).rest == argv[2:]


@pytest.mark.parametrize(("text", "rest"), [
    # sh ends the command at an unquoted ; | & also inside a word: init kept `8001;` as the
    # port (refused), `/m&` as the model (a path that is not there), `4096|tee` as a value
    ("vllm serve /m --port 8001; echo started", ["/m", "--port", "8001"]),
    ("vllm serve /m --max-model-len 4096|tee vllm.log", ["/m", "--max-model-len", "4096"]),
    ("vllm serve /m --port 8001 2>&1|tee vllm.log", ["/m", "--port", "8001"]),
    ("vllm serve /m&", ["/m"]),
    ("vllm serve /m --port 8001&&echo up", ["/m", "--port", "8001"]),
    ("vllm serve /m --port 8001 & echo $!", ["/m", "--port", "8001"]),
    # bash's &> and &>>, and >| (noclobber's override): redirections, their file dropped
    ("vllm serve /m --port 8001 &> vllm.log &", ["/m", "--port", "8001"]),
    ("vllm serve /m --port 8001 &>>vllm.log", ["/m", "--port", "8001"]),
    ("vllm serve /m --port 8001 >| vllm.log", ["/m", "--port", "8001"]),
    # quoted or escaped, they are vLLM's
    ("vllm serve /m --x 'a;b' --y a\\|b --z \"a&b\"", ["/m", "--x", "a;b", "--y", "a|b",
                                                      "--z", "a&b"]),
])
def test_a_shell_operator_inside_a_word_ends_the_command_as_sh_reads_it(
        text: str, rest: list[str]) -> None:
    assert serveline.parse(serveline.split_text(text)).rest == rest


@pytest.mark.parametrize("text", ["vllm serve /m --chat-template <(curl -s http://x/t)",
                                  "vllm serve /m --port 8001 > >(tee log)"])
def test_a_process_substitution_is_refused_as_an_expansion(text: str) -> None:
    """bash's <(...) gives vLLM a /dev/fd/N path init cannot know: `--chat-template
    <(curl ...)` became the value 'http://x/t)'."""
    with pytest.raises(serveline.LineError, match=r"uses the shell's [<>]\("):
        serveline.split_text(text)


@pytest.mark.parametrize(("text", "rest"), [
    # sh ends a word at an unquoted < or > too: init wrote model = "/m>log" (check: "does not
    # exist"), served_model_name = "a>b" (clients' calls 404), a cron line's last value with
    # its log file
    ("vllm serve /m>log", ["/m"]),
    ("vllm serve /m>>/var/log/vllm.log 2>&1", ["/m"]),
    ("vllm serve /m<in --port 8001", ["/m", "--port", "8001"]),
    ("vllm serve /m&>log", ["/m"]),
    ("vllm serve /m>|log", ["/m"]),
    ("vllm serve /m --port 8001 --served-model-name a>b", ["/m", "--port", "8001",
                                                           "--served-model-name", "a"]),
    ("vllm serve /m --max-model-len=4096>/dev/null 2>&1 &", ["/m", "--max-model-len=4096"]),
    ("vllm serve /m>log; echo started", ["/m"]),
    # a word of digits before it is the descriptor sh redirects (`8001>log`: not a port)
    ("vllm serve /m --port 8001>log", ["/m", "--port"]),
    # here-strings, here-documents, <>: the word after <<< was kept as vLLM's
    ("vllm serve /m <<< x --port 8001", ["/m", "--port", "8001"]),
    ("vllm serve /m <<'EOF' --port 8001", ["/m", "--port", "8001"]),
    ("vllm serve /m <>rw --port 8001", ["/m", "--port", "8001"]),
    # quoted or escaped, vLLM's
    ("vllm serve /m --x 'a>b' --y a\\>b --z \"a<b\" --w a'>'b", ["/m", "--x", "a>b", "--y",
                                                                "a>b", "--z", "a<b", "--w",
                                                                "a>b"]),
])
def test_a_redirection_glued_to_a_word_ends_the_word_as_sh_reads_it(
        text: str, rest: list[str]) -> None:
    assert serveline.parse(serveline.split_text(text)).rest == rest
    if rest[-1] == "--port":  # the port sh took for a descriptor: refused, never written
        draft = translate.translate(serveline.parse(serveline.split_text(text)), Facts())
        assert any("`--port`: no value on the line" in f for f in draft.fatal), draft.fatal


@pytest.mark.parametrize("text", ["export HF_HOME=/x; vllm serve /m --port 8001",
                                  "export HF_HOME=/x && vllm serve /m --port 8001",
                                  "HF_HOME=/x;vllm serve /m --port 8001; echo up"])
def test_an_export_before_the_command_on_its_line_is_kept_as_on_a_line_of_its_own(
        text: str) -> None:
    """`export HF_HOME=/x; vllm serve ...` (one line of a runbook) gave HF_HOME '/x;' before
    5dfbfa4 and, once an unquoted ; ended the command, 'no `vllm serve` in the command
    line', which it holds: what follows ;, && after assignments is the next command, as the
    same words on two lines are read."""
    line = serveline.parse(serveline.split_text(text))
    assert line.env == {"HF_HOME": "/x"} and line.rest == ["/m", "--port", "8001"]


def test_an_appending_flag_given_twice_keeps_each_value() -> None:
    """vLLM appends --middleware (action="append"): init kept the last only."""
    vllm, _, draft = init("vllm serve /m --middleware pkg.a --max-num-seqs 8 "
                          "--middleware pkg.b --max-num-seqs 16")
    assert vllm["extra_args"] == ["--middleware", "pkg.a", "--middleware", "pkg.b"]
    assert vllm["args"]["max-num-seqs"] == 16  # every other flag: the last counts
    assert any("--middleware is given 2 times" in said for said in draft.said), draft.said


def test_several_api_keys_are_refused_not_joined_into_one() -> None:
    """`--api-key k1 k2`: vLLM takes each as a key; init joined them into one key file, so
    after migration every client got 401."""
    _, _, draft = init("vllm serve /m --api-key key-one key-two")
    assert draft.api_key is None
    assert any("gives 2 keys" in e and "keep one key" in e for e in draft.fatal), draft.fatal


@pytest.mark.parametrize("words", [
    ["HF_TOKEN=hf_line1\nline2", "vllm", "serve", "/m"],
    ["vllm", "serve", "/m", "--api-key", " sk-spaced-key "],
    ["vllm", "serve", "/m", "--hf-token", "hf_abc\rdef"],
])
def test_a_secret_its_file_cannot_carry_is_refused_not_written_broken(words: list[str]) -> None:
    """init wrote `HF_TOKEN=...` over two lines: every launch was refused ("expected
    NAME=value") while init had said it was done; spaces at an end were trimmed off."""
    draft = translate.translate(serveline.parse(words), Facts(known=known()))
    assert not draft.secret_env and draft.api_key is None
    assert any("line break or spaces" in e for e in draft.fatal), draft.fatal


@pytest.mark.parametrize("text", [
    "HF_TOKEN=hf_abcdefghijklmnopqrstu vllm serve m",
    "MY_PASSWORD=p1x2y3 vllm serve m --hf-token hf_ghijklmnopqrstuvwxyz",
    "vllm serve m --api-key k1x2y3z4",
    "VLLM_API_KEY=k1x2y3z4 vllm serve m --hf-token",
    "vllm serve m --api-key a1b2c3 --api-key d4e5f6",
    "AWS_SECRET_ACCESS_KEY=abcd1234 DB_PASS=zz99yy88 vllm serve m",
    "HF_TOKEN='a b ' vllm serve m",  # (a quote after a space: split_text raised on it)
    "vllm serve m --chat-template 'x y ' --api-key 'k1 '",
    # a flag vLLM refuses, dropped or refused (migrate/refusals.py): the secret flags' names
    # are in backticks there, where the redactor reads no value after them
    "vllm serve m --Max-Model-Len 4096 --no-hf-token --no-api-key --max-num-seqs",
    "vllm serve m --HF-TOKEN hf_abcdefghijklmnopqrstu --enforce-eager=foo",
    "vllm serve m --API-KEY k1x2y3z4", "vllm serve m --Api-Key=k1x2y3z4 --PORT 8001",
    "vllm serve m --hf-token true --port",
])
def test_inits_own_words_pass_the_redactor_unchanged(text: str) -> None:
    """init's notes go through the redactor; its own words must not read as a secret's name
    and value to it ("holds a secret: written to ..." came out "holds a secret: <redacted>
    to ..."), and none of them carries a secret's value to be hidden."""
    from vllmwatch.config.redact import REDACT
    from vllmwatch.migrate.deliver import _secrets_todo
    _, _, draft = init(text)
    _secrets_todo(draft, Facts(known=known()), io.StringIO())
    said = [*draft.fatal, *draft.errors, *draft.said, *draft.todo]
    assert said and [m for m in said if REDACT.text(m) != m] == []


def test_stdout_says_where_the_secrets_go_never_that_it_wrote_them(tmp_path: Path) -> None:
    path = tmp_path / "vllmwatch.toml"
    err = io.StringIO()
    req = runner.Request([f"HF_TOKEN=hf_abcdefghijklmnopqrstu vllm serve /srv/m --api-key "
                          f"{SECRET}"], None, str(path), stdout=True, fast=True)
    assert runner.main(req, os.environ, out=io.StringIO(), err=err) == 0
    text = err.getvalue()
    assert not path.exists() and not (tmp_path / "secrets.env").exists()
    assert "written" not in text and "wrote" not in text, text
    assert f"create {tmp_path / 'secrets.env'}" in text and "HF_TOKEN" in text
    assert SECRET not in text and "hf_abcdefghijklmnopqrstu" not in text


_SHELL_CHARS = st.sampled_from(list("ab '\"=-{}:\\$#>&|;<\t"))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.text(_SHELL_CHARS, min_size=1, max_size=8), max_size=5))
def test_a_line_the_shell_would_quote_gives_back_its_words(words: list[str]) -> None:
    """A pasted line is read as sh reads it: a word quoted or escaped from its first
    character (`';'`, `'>x'`, `\\|`, a lone `'\\'`) is vLLM's, never the end of the command,
    a redirection or a continuation; a quote after a space (X='a b ') no longer fails."""
    argv = ["vllm", "serve", *words]
    assert serveline.split_text(shlex.join(argv)) == argv


@pytest.mark.parametrize("words", [
    ["vllm serve /m --api-key key-one key-two"],
    ["vllm", "serve", "/m", "--api-key", "sk-spaced-key "],
    ["VLLM_API_KEY='k1 ' vllm serve /m"],
    ["HF_TOKEN='hf_abc def ' vllm serve /m"],
])
def test_a_secret_init_cannot_carry_stops_it_writing_anything(tmp_path: Path,
                                                              words: list[str]) -> None:
    """init printed an error for a key it dropped and still wrote a config, exit 0: vLLM
    would then serve on 0.0.0.0 without the line's key. Now nothing is written, exit 2."""
    path = tmp_path / "vllmwatch.toml"
    for stdout in (False, True):
        out, err = io.StringIO(), io.StringIO()
        req = runner.Request(words, None, str(path), fast=True, stdout=stdout)
        assert runner.main(req, os.environ, out=out, err=err) == 2
        assert "nothing written" in err.getvalue() and out.getvalue() == "", err.getvalue()
        assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("line", "name"), [
    (f"vllm serve /m --api-k {SECRET}", "--api-k"),
    (f"vllm serve /m --api-ke={SECRET}", "--api-ke"),
    (f"vllm serve /m \u2014api-key {SECRET}", "\u2014api-key"),  # an em dash, from a web page
    (f"vllm serve /m \u2013api-key={SECRET}", "\u2013api-key"),
])
def test_a_secret_flag_spelt_otherwise_is_still_a_secret(tmp_path: Path, line: str,
                                                         name: str) -> None:
    """`--api-k KEY` (vLLM takes the prefix) was written as `api-k = "KEY"` in the TOML and
    the header; an em-dashed `—api-key KEY` was printed whole as a word that follows no flag."""
    path = tmp_path / "vllmwatch.toml"
    out, err = io.StringIO(), io.StringIO()
    assert runner.main(runner.Request([line], None, str(path), fast=True), os.environ,
                       out=out, err=err) == 0, err.getvalue()
    assert SECRET not in path.read_text() + out.getvalue() + err.getvalue()
    assert (tmp_path / "api-key").read_text() == SECRET + "\n"
    assert f"the line's `{name}`" in err.getvalue()


def test_an_abbreviated_flag_is_written_in_full_as_vllm_reads_it() -> None:
    vllm, _, draft = init("vllm serve /m --max-model 4096 --gpu-memory-util 0.8")
    assert vllm["args"]["max-model-len"] == 4096
    assert vllm["args"]["gpu-memory-utilization"] == 0.8
    assert any("`--max-model` is vLLM's --max-model-len, abbreviated" in s for s in draft.said)


@pytest.mark.parametrize("text", [
    "sudo -u vllm HF_TOKEN=hf_abcdefghijklmnopqrstu vllm serve /m --port 9000",
    "nice -n 10 vllm serve /m --port 9000", "numactl -N 0 -m 0 vllm serve /m --port 9000",
    "taskset -c 0-7 vllm serve /m --port 9000", "taskset 0x3 vllm serve /m --port 9000",
    "sudo -E -u vllm env X=1 nice -n 5 vllm serve /m --port 9000",
    "chrt -f 99 stdbuf -oL vllm serve /m --port 9000",
])
def test_a_wrapper_with_options_is_read_past(text: str) -> None:
    """`sudo -u vllm HF_TOKEN=... vllm serve` became command = ["vllm", "HF_TOKEN=...", ...]
    (the token in clear); `nice -n 10`, `numactl -N 0` failed with "no vllm serve"."""
    line = serveline.parse(serveline.split_text(text))
    assert line.command == ["vllm", "serve"] and line.rest == ["/m", "--port", "9000"], line
    assert all("=" not in word for word in line.command)


@pytest.mark.parametrize(("text", "named"), [
    ('vllm serve /m --api-key "$VLLM_KEY"', "$VLLM_KEY"),
    ("HF_TOKEN=${HF_TOKEN} vllm serve /m", "${HF_TOKEN}"),
    ("vllm serve /m --served-model-name $(hostname)", "$(hostname)"),
    ("vllm serve /m --served-model-name `hostname`", "`hostname`"),
    ("vllm serve /m --download-dir ~/models", "~"),
])
def test_a_line_that_needs_the_shell_to_expand_it_is_refused_saying_why(text: str,
                                                                       named: str) -> None:
    """`--api-key "$VLLM_KEY"` wrote the text `$VLLM_KEY` into the key file: every client
    then got 401. init cannot know what the shell put there."""
    with pytest.raises(serveline.LineError, match="--from-pid") as got:
        serveline.split_text(text)
    assert f"the line uses the shell's {named}" in str(got.value)


@pytest.mark.parametrize(("text", "words"), [
    ("vllm serve /m --port 9000  # the test box", ["/m", "--port", "9000"]),
    ("vllm serve /m --x a#b", ["/m", "--x", "a#b"]),  # not a comment: inside a word
    ("vllm serve /m --t '$x `y` ~z' --p \\$5 \"#x\"", ["/m", "--t", "$x `y` ~z", "--p", "$5",
                                                       "#x"]),
])
def test_a_comment_is_dropped_and_what_the_shell_keeps_literal_stays(text: str,
                                                                    words: list[str]) -> None:
    assert serveline.split_text(text) == ["vllm", "serve", *words]


def test_a_relative_api_key_file_is_written_absolute(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`init --api-key-file mykey` wrote api_key_file = "mykey": the service starts in /."""
    monkeypatch.chdir(tmp_path)
    req = runner.Request([f"vllm serve /m --api-key {SECRET}"], None, str(tmp_path / "v.toml"),
                         fast=True, api_key_file="mykey")
    assert runner.main(req, os.environ, out=io.StringIO(), err=io.StringIO()) == 0
    assert tomllib.loads((tmp_path / "v.toml").read_text())["vllm"]["api_key_file"] == \
        str(tmp_path / "mykey")


def _fake_dpkg_query(tmp_path: Path, listed: Path, md5: str) -> str:
    """A PATH whose dpkg-query lists `listed` as the vllmwatch package's conffile."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "dpkg-query"
    tool.write_text(f"#!/bin/sh\n[ \"$3\" = vllmwatch ] && echo ' {listed} {md5}'\n")
    tool.chmod(0o755)
    return f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"


@pytest.mark.parametrize("edited", [False, True])
def test_init_replaces_the_packages_unedited_example_but_never_an_edited_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edited: bool) -> None:
    """`apt install ./vllmwatch.deb` puts the example at /etc/vllmwatch/vllmwatch.toml (a
    conffile); install.md's next command, `sudo vllmwatch init --from-pid ...`, was refused
    there ("exists; not replaced") on every fresh install. The package's file as dpkg
    installed it (its conffile checksum) is replaced; one with any edit still needs --force."""
    import hashlib

    path = tmp_path / "vllmwatch.toml"
    shipped = (Path(__file__).resolve().parents[2] / "etc" / "vllmwatch.toml").read_bytes()
    path.write_bytes(shipped + (b"# mine\n" if edited else b""))
    monkeypatch.setenv("PATH", _fake_dpkg_query(tmp_path, path,
                                                hashlib.md5(shipped).hexdigest()))
    err = io.StringIO()
    req = runner.Request(["vllm serve /srv/other --port 8124"], None, str(path), fast=True)
    rc = runner.main(req, os.environ, out=io.StringIO(), err=err)
    if edited:
        assert rc == 2 and "exists; not replaced" in err.getvalue()
        assert path.read_bytes().endswith(b"# mine\n")
    else:
        assert rc == 0, err.getvalue()
        assert "package's example config" in err.getvalue()
        assert tomllib.loads(path.read_text())["vllm"]["model"] == "/srv/other"
