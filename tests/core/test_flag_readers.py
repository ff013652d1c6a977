"""A flag's value is judged by the reader vLLM itself reads it with (its probe records each:
int, float, human_readable_int, its _or_auto, str, a folding reader; optional_type's "None"),
and by its choices whatever their type: `check` and `run` refuse exactly the words vLLM 0.32's
parser refuses. Before, one loose rule stood for every number flag (`max-num-seqs = "1k"`,
`gpu-memory-utilization = "auto"` passed `check` and stopped vLLM at each start), and choices
were read only for plain-text flags (`spec-method = "eagel"`, `max-lora-rank = 48` passed)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.flagprobe import probe_with
from vllmwatch.config import flags, flagvalues, units, vllmflags
from vllmwatch.config.redact import REDACT
from vllmwatch.config.schema import from_dict
from vllmwatch.shell import versions
from vllmwatch.testing.waiting import wait_for

FIXTURES = Path(__file__).resolve().parent.parent / "shell" / "fixtures"


def _known(parsers: bool = True) -> vllmflags.FlagSet:
    """vLLM 0.32.0's flags as the probe reports them (the cache's format)."""
    data = json.loads((FIXTURES / "vllm-0.32.0-flags.json").read_text())
    return vllmflags.FlagSet(data["version"], frozenset(data["flags"]),
                             frozenset(data["switches"]), data["kinds"], data["aliases"],
                             frozenset(data["lists"]), frozenset(data["integers"]),
                             {k: tuple(v) for k, v in data["choices"].items()},
                             data["parsers"] if parsers else None,
                             {k: tuple(v) for k, v in data["fields"].items()})


# vLLM 0.32.0's own parser (make_arg_parser(FlexibleArgumentParser).parse_args(["/m", flag,
# word])) on each word: True where it read it, False where it stopped ("invalid int value",
# "invalid choice", ...).
VLLM_0_32 = [
    ("max-num-seqs", "1k", False), ("max-num-seqs", "auto", False),
    ("max-num-seqs", "None", False), ("max-num-seqs", "2.5k", False),
    ("max-num-seqs", "+5", True), ("max-num-seqs", "1_000", True),
    ("gpu-memory-utilization", "auto", False), ("gpu-memory-utilization", "32k", False),
    ("gpu-memory-utilization", "none", False), ("gpu-memory-utilization", ".9", True),
    ("max-num-batched-tokens", "auto", False), ("max-num-batched-tokens", "None", False),
    ("max-num-batched-tokens", "25.6k", True), ("max-num-batched-tokens", "-1", True),
    ("max-model-len", "auto", True), ("max-model-len", "AUTO", True),
    ("max-model-len", "32k", True), ("max-model-len", "1.5K", False),
    ("max-model-len", "none", False),
    ("seed", "none", False), ("seed", "", False), ("seed", "-1e3", False),
    ("kv-cache-memory-bytes", "None", True), ("kv-cache-memory-bytes", "8G", True),
    ("max-cpu-loras", "none", False), ("video-pruning-rate", "None", True),
    ("max-lora-rank", "48", False), ("max-lora-rank", "64", True),
    ("safetensors-load-strategy", "lazzy", False), ("safetensors-load-strategy", "lazy", True),
    ("safetensors-load-strategy", "None", True), ("spec-method", "eagel", False),
    ("moe-backend", "CUTLASS", True), ("moe-backend", "cutlas", False),
    ("dtype", "BFloat16", False), ("log-level", "info", False),
]


@pytest.mark.parametrize(("flag", "word", "reads"), VLLM_0_32)
@pytest.mark.parametrize("where", ["args", "extra_args"])
def test_check_refuses_exactly_what_vllms_parser_refuses(flag: str, word: str, reads: bool,
                                                         where: str) -> None:
    vllm: dict[str, Any] = {"model": "/m"}
    if where == "args":
        vllm["args"] = {flag: word}
    else:
        vllm["extra_args"] = [f"--{flag}", word]
    problems = vllmflags.validate_args(from_dict({"vllm": vllm}), _known())
    assert (not problems) == reads, problems
    if problems:  # the key, the value and what is accepted
        text = problems[0].problem
        assert f"--{flag}" in text and repr(word) in text, text
        assert "choose one of" in text or "takes " in text, text


@pytest.mark.parametrize(("args", "says"), [
    ({"max-num-seqs": "1k"}, "read by int()"),
    ({"gpu-memory-utilization": "32k"}, "read by float()"),
    ({"max-num-batched-tokens": "auto"}, "no auto"),
    ({"max-cpu-loras": "none"}, "or None for vLLM's default"),
    ({"max-lora-rank": 48}, "choose one of 1, 8, 16, 32, 64"),  # a TOML number: its word
    ({"max-num-seqs": 8192.0}, "read by int()"),  # a TOML float is `8192.0` on vLLM's argv
])
def test_the_refusal_says_what_vllm_accepts(args: dict[str, object], says: str) -> None:
    problems = vllmflags.validate_args(from_dict({"vllm": {"model": "/m", "args": args}}),
                                       _known())
    assert problems and says in problems[0].problem, problems


@pytest.mark.parametrize(("spec", "word", "value"), [
    ("hr_int", "25.6k", 25600), ("hr_int", "2K", 2048), ("hr_int", " 3m ", 3_000_000),
    ("hr_int_auto", "Auto", -1), ("hr_int?", "None", None), ("int?", "", None),
    ("fold", "Deep-Gemm", "deep_gemm"), ("float", "1e-3", 0.001),
])
def test_vllms_readers(spec: str, word: str, value: object) -> None:
    assert units.vllm_read(spec, word) == value


@pytest.mark.parametrize(("spec", "word"), [("hr_int", "1.5K"), ("hr_int", "auto"),
                                            ("int", "None"), ("float", "nan"),
                                            ("hr_int_auto", "none"), ("int?", "none")])
def test_vllms_readers_refuse(spec: str, word: str) -> None:
    with pytest.raises(ValueError):
        units.vllm_read(spec, word)


def test_an_older_cache_is_judged_loosely_and_is_not_complete() -> None:
    # an older vllmwatch's answer names no reader: a word any of vLLM's number readers takes
    # passes (not a guess that refuses); the daemon and `check` ask vLLM again
    known = _known(parsers=False)
    assert not known.complete and _known().complete
    config = from_dict({"vllm": {"model": "/m", "args": {"max-num-seqs": "1k"}}})
    assert vllmflags.validate_args(config, known) == []
    config = from_dict({"vllm": {"model": "/m", "args": {"max-num-seqs": "1.5K"}}})
    assert vllmflags.validate_args(config, known)


def test_the_cache_keeps_the_readers(tmp_path: Path) -> None:
    import hashlib

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    key = hashlib.sha256(f"0.32.0\0{sys.executable}".encode()).hexdigest()[:16]
    table = json.loads((FIXTURES / "vllm-0.32.0-flags.json").read_text())
    (cache / f"{key}.json").write_text(json.dumps(table))
    got = vllmflags.known_flags([sys.executable], "0.32.0", str(cache), ask=False)
    assert got is not None and got.complete and got.parsers == table["parsers"]


def test_the_daemon_renews_an_older_cache_in_the_background(tmp_path: Path) -> None:
    # its launches used an older vllmwatch's answer (loose values) for ever: only `check`
    # without --fast asked vLLM again
    import hashlib

    key = hashlib.sha256(f"0.99.0\0{sys.executable}".encode()).hexdigest()[:16]
    old = {k: v for k, v in json.loads((FIXTURES / "vllm-0.32.0-flags.json").read_text()
                                       ).items() if k != "parsers"}
    config = from_dict({"vllm": {"model": "/m", "command": [sys.executable],
                                 "args": {"max-num-seqs": "1k"}},
                        "prewarm": {"cache_dir": str(tmp_path)}})
    logged: list[tuple[str, str, dict[str, Any]]] = []
    lock = threading.Lock()

    def log(level: str, event: str, **fields: Any) -> None:
        with lock:
            logged.append((level, event, fields))

    env = {"CACHE_DIRECTORY": "", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    cache_dir = vllmflags.default_cache_dir(config, env)
    Path(cache_dir).mkdir(mode=0o700, exist_ok=True)
    (Path(cache_dir) / f"{key}.json").write_text(json.dumps({**old, "version": "0.99.0"}))
    assert versions.refusal(config, env, "0.99.0", log) is None  # loose: 1k passes
    def asked_done() -> bool:  # the ask runs this interpreter, which has no vLLM
        with versions._lock:
            return not versions._asking

    wait_for(asked_done, 60, "the background ask of vLLM's flags to end")
    with lock:
        asked = [f for _, e, f in logged if e == "vllm.flags_unchecked"]
    assert asked and "older vllmwatch" in asked[0]["detail"], logged


def _vllm_like_parser() -> argparse.ArgumentParser:
    """Flags read as vLLM 0.32 reads them (engine/arg_utils.py: optional_type(parse_type(
    int)), human_readable_int, Literal choices with None appended, a lowering lambda)."""
    def parse_type(f: Any) -> Any:
        def _parse_type(val: str) -> Any:
            return f(val)
        return _parse_type

    def optional_type(f: Any) -> Any:
        def _optional_type(val: str) -> Any:
            return None if val in ("", "None") else parse_type(f)(val)
        return _optional_type

    def human_readable_int(value: str) -> int:
        return int(value)

    def human_readable_int_or_auto(value: str) -> int:
        return int(value)

    p = argparse.ArgumentParser()
    p.add_argument("--seqs", type=int)
    p.add_argument("--cpu-loras", type=optional_type(int))
    p.add_argument("--util", type=float)
    p.add_argument("--tokens", type=human_readable_int)
    p.add_argument("--bytes", type=optional_type(human_readable_int))
    p.add_argument("--len", type=human_readable_int_or_auto)
    p.add_argument("--rank", type=int, choices=[1, 8, 16])
    p.add_argument("--strategy", type=optional_type(str), choices=["eager", "lazy", None])
    p.add_argument("--moe", type=lambda s: s.lower().replace("-", "_"), choices=["deep_gemm"])
    p.add_argument("--ids", type=lambda s: s.split(","))
    p.add_argument("--name")
    p.add_argument("--token", nargs="?", const=True)  # may go without its value: not judged
    p.add_argument("--eager", action=argparse.BooleanOptionalAction)
    return p


def test_the_probe_records_each_flags_reader(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    got = probe_with(_vllm_like_parser, monkeypatch, capsys)
    assert got is not None and got.parsers == {
        "seqs": "int", "cpu-loras": "int?", "util": "float", "tokens": "hr_int",
        "bytes": "hr_int?", "len": "hr_int_auto", "rank": "int", "strategy": "str?",
        "moe": "fold", "name": "str"}, got
    assert got.choices == {"rank": ("1", "8", "16"), "strategy": ("eager", "lazy"),
                           "moe": ("deep_gemm",)}


@pytest.mark.parametrize("where", ["args", "extra_args"])
def test_a_kv_cache_dtype_vllm_takes_is_not_refused_by_the_built_in_list(where: str) -> None:
    # vLLM 0.32 takes `--kv-cache-dtype float16`; the built-in list (judging with or without
    # vLLM's own flag list, at load) refused it as "fp16 is not a choice", and init rewrote it
    # to auto
    from tests.shell.test_init import init

    def refused(word: str) -> list[str]:
        args, extra = ({"kv-cache-dtype": word}, []) if where == "args" else (
            {}, ["--kv-cache-dtype", word])
        config = from_dict({"vllm": {"model": "/m", "args": args, "extra_args": extra}})
        return [p.problem for p in (*flags.args_problems(args, extra),  # at load
                                    *vllmflags.validate_args(config, _known()))]

    assert refused("float16") == []
    assert any("fp16 is not a choice" in p for p in refused("fp16"))
    assert init("vllm serve /m --kv-cache-dtype float16")[0]["args"]["kv-cache-dtype"] == \
        "float16"


# vLLM 0.32's parser on these words: `--cpu-offload-gb -0.5 --enforce-eager` stopped with
# `unrecognized arguments: {"5": "--enforce-eager"}` (its FlexibleArgumentParser reads a word
# that starts with - and has a dot as a JSON key, and takes the next word for its value),
# `--cpu-offload-gb -0.5` last raised IndexError, `--cpu-offload-gb -1e3` stopped with
# `expected one argument`; `--cpu-offload-gb=-0.5`, `--seed -5` were read.
@pytest.mark.parametrize(("extra", "refused"), [
    (["--cpu-offload-gb", "-0.5", "--enforce-eager"], True),
    (["--cpu-offload-gb", "-0.5"], True), (["--cpu-offload-gb", "-1e3"], True),
    (["--cpu-offload-gb", "-1."], True),
    (["--cpu-offload-gb=-0.5"], False), (["--seed", "-5"], False),
    (["--max-model-len", "-1"], False),
])
def test_a_negative_number_vllm_reads_as_a_flag_is_refused(extra: list[str],
                                                          refused: bool) -> None:
    problems = flags.args_problems({}, extra)
    assert bool(problems) == refused, problems
    if refused:
        assert f"join it to its flag with =: --cpu-offload-gb={extra[1]}" in \
            problems[0].problem, problems


def test_a_negative_number_of_the_table_or_env_file_reaches_vllm_joined_to_its_flag() -> None:
    # [vllm.args] wrote `--cpu-offload-gb -0.5`, two words vLLM cannot read
    from vllmwatch.config.command import args_to_argv

    assert args_to_argv({"cpu-offload-gb": -0.5, "seed": -5, "dtype": "half"}) == [
        "--cpu-offload-gb=-0.5", "--seed=-5", "--dtype", "half"]
    assert flags.pair_words(["--cpu-offload-gb", "-0.5", "--seed", "7"]) == [
        "--cpu-offload-gb=-0.5", "--seed", "7"]


# vLLM 0.32.0's parser: `--cudagraph-capture-sizes 1 2 x` stopped (`invalid int value: 'x'`),
# `--collect-detailed-traces all bogus` too (`invalid choice: 'bogus'`): each word of a flag
# of several words (nargs "+") goes through the flag's reader and choices; only the first
# was judged.
@pytest.mark.parametrize(("extra", "key"), [
    (["--cudagraph-capture-sizes", "1", "2", "x"], "vllm.extra_args[3]"),
    (["--enforce-eager", "--collect-detailed-traces", "all", "bogus"], "vllm.extra_args[3]"),
    (["--cudagraph-capture-sizes", "1", "2", "4"], None),
    (["--collect-detailed-traces", "model", "worker"], None),
])
def test_each_word_of_a_flag_of_several_words_is_judged(extra: list[str],
                                                       key: str | None) -> None:
    problems = vllmflags.validate_args(from_dict({"vllm": {"model": "/m", "extra_args": extra}}),
                                       _known())
    assert [p.key for p in problems] == ([key] if key else []), problems
    if key:
        assert repr(extra[-1]) in problems[0].problem, problems


# vLLM 0.32.0's parser: `--enforce-eager --tool-call-parser`, `--tokenizer --enforce-eager`,
# `--chat-template` and `--cudagraph-capture-sizes` alone stopped it (`expected one argument`,
# `expected at least one argument`); `--hf-token --enforce-eager` was read (--hf-token may go
# without its value). check passed all four: a flag without its word was never judged.
@pytest.mark.parametrize(("vllm", "key"), [
    ({"extra_args": ["--enforce-eager", "--tool-call-parser"]}, "vllm.extra_args[1]"),
    ({"extra_args": ["--tokenizer", "--enforce-eager"]}, "vllm.extra_args[0]"),
    ({"args": {"chat-template": True}}, "vllm.args.chat-template"),
    ({"extra_args": ["--cudagraph-capture-sizes"]}, "vllm.extra_args[0]"),
    ({"extra_args": ["--hf-token", "--enforce-eager"]}, None),
])
def test_a_flag_given_no_value_is_refused(vllm: dict[str, Any], key: str | None) -> None:
    problems = vllmflags.validate_args(from_dict({"vllm": {"model": "/m", **vllm}}), _known())
    assert [p.key for p in problems] == ([key] if key else []), problems
    if key:
        assert "takes a value" in problems[0].problem and "none" in problems[0].problem


def test_words_after_a_list_flag_joined_to_its_value_are_refused() -> None:
    # vLLM 0.32.0: `--cudagraph-capture-sizes=1 2 4` stopped with `unrecognized arguments:
    # 2 4` (a value after = is the flag's one word); check passed it, a flag of several words
    problems = vllmflags.validate_args(from_dict({"vllm": {
        "model": "/m", "extra_args": ["--cudagraph-capture-sizes=1", "2", "4"]}}), _known())
    assert [p.key for p in problems] == ["vllm.extra_args[0]"], problems
    assert "'2' '4' follow" in problems[0].problem, problems
    assert vllmflags.validate_args(from_dict({"vllm": {
        "model": "/m", "extra_args": ["--cudagraph-capture-sizes=1", "--enforce-eager"]}}),
        _known()) == []


def test_the_env_files_flags_are_judged_by_vllms_list_their_values_unshown(
        tmp_path: Path) -> None:
    # `check` said "0 flag(s) accepted" of this file, and vLLM stopped at every launch
    # (`unrecognized arguments: --max-model-length`, `invalid int value`)
    env = tmp_path / "vllm.env"
    env.write_text("VLLMWATCH_ARG_MAX_MODEL_LENGTH=8192\nVLLMWATCH_ARG_MAX_NUM_SEQS=s3cr3t-v4lue\n"
                   "VLLMWATCH_ARG_MAX_MODEL_LEN=32k\nVLLMWATCH_ARG_OTLP_TRACES_ENDPOINT=x\n")
    env.chmod(0o600)
    config = from_dict({"vllm": {"model": "/m", "env_file": str(env)}})
    problems = vllmflags.validate_args(config, _known())
    assert [p.key for p in problems] == ["vllm.env_file: VLLMWATCH_ARG_MAX_MODEL_LENGTH",
                                         "vllm.env_file: VLLMWATCH_ARG_MAX_NUM_SEQS"], problems
    assert "did you mean max-model-len" in problems[0].problem
    assert "read by int()" in problems[1].problem and "<value>" in problems[1].problem
    assert all("s3cr3t" not in p.problem for p in problems), problems
    env.unlink()  # a file that cannot be read: the launch's own reading says why
    assert vllmflags.validate_args(config, _known()) == []


@pytest.mark.parametrize("dropped", ["parsers", "fields"])
def test_check_says_when_it_judges_values_only_loosely(tmp_path: Path, dropped: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # an older vllmwatch's cache names no reader (or no JSON reader, no class's keys): check
    # must not claim what it cannot know
    import hashlib

    from vllmwatch.check import vllm as check_vllm
    from vllmwatch.check.base import PASS, Context

    key = hashlib.sha256(f"0.99.0\0{sys.executable}".encode()).hexdigest()[:16]
    old = {k: v for k, v in json.loads((FIXTURES / "vllm-0.32.0-flags.json").read_text()
                                       ).items() if k != dropped}
    (tmp_path / f"{key}.json").write_text(json.dumps({**old, "version": "0.99.0"}))
    (tmp_path / f"{key}.json").chmod(0o600)
    tmp_path.chmod(0o700)
    monkeypatch.setattr(check_vllm.vllminfo, "version", lambda command: "0.99.0")
    config = from_dict({"vllm": {"model": "/m", "command": [sys.executable],
                                 "args": {"max-num-seqs": 8}}})
    r = check_vllm.check_vllm_args(Context(config, fast=True, flags_cache=str(tmp_path)))
    assert r.status == PASS and "only loosely" in r.detail, r


# vLLM 0.32.0's parser (argparse's allow_abbrev): `--max-num-seq 4`, `--gpu-memory-util 0.5`
# were read as --max-num-seqs, --gpu-memory-utilization; `--max-num 4` stopped it
# (`ambiguous option`). vllmwatch refuses them all (its own readers take full names), but
# said "--gpu-memory-util is not a flag of vLLM", which vLLM's own run contradicts.
@pytest.mark.parametrize(("flag", "says"), [
    ("--max-num-seq", "--max-num-seq is --max-num-seqs abbreviated: vLLM 0.32.0 takes a unique"),
    ("--gpu-memory-util", "write --gpu-memory-utilization"),
    ("--max-num", "`ambiguous option`"),
])
def test_an_abbreviated_flag_is_refused_for_what_it_is(flag: str, says: str) -> None:
    problems = vllmflags.validate_args(from_dict({"vllm": {"model": "/m",
                                                           "extra_args": [flag, "4"]}}), _known())
    assert len(problems) == 1 and says in problems[0].problem, problems


@pytest.mark.parametrize(("flag", "value", "refused"), [
    ("speculative-config", 5, True), ("speculative-config", "[1, 2]", True),
    ("speculative-config", '"ngram"', True), ("limit-mm-per-prompt", "4", True),
    ("speculative-config", {"method": "ngram", "num_speculative_tokens": 3}, False),
    ("speculative-config", '{"method": "ngram"}', False), ("speculative-config", "None", False),
    ("speculative-config", "null", False), ("limit-mm-per-prompt", {"image": 2}, False),
    ("allowed-origins", '["*"]', False)])
def test_a_dict_field_s_json_flag_takes_only_an_object(flag: str, value: object,
                                                      refused: bool) -> None:
    """`speculative-config = 5` passed `check` (json.loads reads any JSON) and vLLM stopped at
    each start (`5.items()`: its field is a dict): the probe says which json.loads flags fill
    a dict (`jsonobj`), and anything but an object (or null) is refused for them."""
    problem = flagvalues.flag_problem(flag, value, f"vllm.args.{flag}", _known())
    assert (problem is not None) == refused, problem
    if refused:  # (its example passes the redactor whole: `{"key": 1}` came out `<redacted>`)
        assert problem is not None and "a JSON object" in problem.problem
        assert REDACT.text(problem.problem) == problem.problem


def test_the_probe_says_which_json_flags_fill_a_dict(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """By the field of vLLM's argument class a flag fills (EngineArgs', FrontendArgs'), not by
    another class's field of the same name (VllmConfig's speculative_config is a class)."""
    import dataclasses
    import types

    @dataclasses.dataclass
    class EngineArgs:
        speculative_config: dict[str, Any] | None = None
        allowed_origins: list[str] | None = None
        mixed: dict[str, int] | str | None = None

    @dataclasses.dataclass
    class AVllmConfig:  # (sorted first: a name not ending in Args is never read)
        allowed_origins: dict[str, Any] | None = None

    arg_utils = types.ModuleType("vllm.engine.arg_utils")
    arg_utils.AVllmConfig, arg_utils.EngineArgs = AVllmConfig, EngineArgs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.engine", types.ModuleType("vllm.engine"))
    monkeypatch.setitem(sys.modules, arg_utils.__name__, arg_utils)

    def parser() -> argparse.ArgumentParser:
        p = argparse.ArgumentParser()
        for flag in ("--speculative-config", "--allowed-origins", "--mixed"):
            p.add_argument(flag, type=json.loads)
        return p

    got = probe_with(parser, monkeypatch, capsys)
    assert got is not None and got.parsers == {
        "speculative-config": "jsonobj", "allowed-origins": "json", "mixed": "json"}, got
