"""A JSON flag's word, --lora-modules' words and a float's nan or inf are judged as vLLM 0.32
reads them. Before, vllmwatch judged a JSON flag only where its word began with { or [ (and as
plain JSON: `--kv-transfer-config '{"kv_connector_extra_config": {"cpu_bytes_to_use": 80m}}'`,
which vLLM expands, was refused), so `--compilation-config abc`, `[1, 2]` or the older
`{"level": 3}` passed `check` and stopped vLLM at every start; `--lora-modules foo` passed too
(vLLM: "Invalid JSON format for --lora-modules"). Its probe now names each JSON reader
(json.loads, a config class, a dict or a word, --lora-modules' action) and the keys a config
class takes; nan and inf, which vLLM's float() reads, are refused for what they are."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

import pytest

from tests.core.test_flag_readers import _known
from tests.support.flagprobe import probe_with
from vllmwatch.config import vllmflags
from vllmwatch.config.schema import from_dict

KV = '{"kv_connector":"OffloadingConnector","kv_role":"kv_both",' \
     '"kv_connector_extra_config":{"cpu_bytes_to_use": 80m}}'
# vLLM 0.32.0's own parser (make_arg_parser(FlexibleArgumentParser).parse_args(["/m", flag,
# word])) on each word: True where it read it, False where it stopped.
VLLM_0_32 = [
    ("lora-modules", "foo", False), ("lora-modules", "sql=/srv/lora/sql", True),
    ("lora-modules", "a=b,c", False), ("lora-modules", '{"name":"a"}', False),
    ("lora-modules", '{"name":"a","path":"/p"}', True),
    ("lora-modules", '{"name":"a","path":"/p","rank":8}', False), ("lora-modules", "[1]", False),
    ("compilation-config", "{bad", False), ("compilation-config", "[1,2]", False),
    ("compilation-config", "abc", False), ("compilation-config", '{"level": 3}', False),
    ("compilation-config", '{"mode": 3}', True),
    ("compilation-config", '{"cudagraph_capture_sizes": [1, 2]}', True),
    ("kv-transfer-config", "notjson", False), ("kv-transfer-config", KV, True),
    ("kv-transfer-config", '{"kv_connector":"X","kv_buffer_size": 1.5K}', False),
    ("kv-transfer-config", '{"bogus":1}', False), ("kv-transfer-config", "None", True),
    ("speculative-config", "{bad", False), ("speculative-config", "None", True),
    ("speculative-config", '{"method":"ngram"}', True),
    ("hf-overrides", "abc", True), ("hf-overrides", "{bad}", False),
    ("hf-overrides", '{"a": 1}', True), ("limit-mm-per-prompt", "abc", False),
    ("limit-mm-per-prompt", '{"image": 2}', True), ("default-chat-template-kwargs", "abc", False),
    ("default-chat-template-kwargs", '{"enable_thinking": false}', True),
]


@pytest.mark.parametrize(("flag", "word", "reads"), VLLM_0_32)
@pytest.mark.parametrize("where", ["args", "extra_args"])
def test_check_refuses_exactly_the_json_words_vllms_parser_refuses(
        flag: str, word: str, reads: bool, where: str) -> None:
    vllm: dict[str, Any] = {"model": "/m"}
    if where == "args":
        vllm["args"] = {flag: word}
    else:
        vllm["extra_args"] = [f"--{flag}", word]
    problems = vllmflags.validate_args(from_dict({"vllm": vllm}), _known())
    assert (not problems) == reads, problems
    if problems:  # the flag, the value, and what vLLM takes
        text = problems[0].problem
        assert (f"--{flag}" in text and repr(word) in text) or "no key" in text, text
        assert "takes " in text or "its keys: " in text, text


@pytest.mark.parametrize(("table", "reads"), [
    ({"mode": 3, "cudagraph_capture_sizes": [1, 2]}, True), ({"level": 3}, False),
    ([1, 2], False)])
def test_a_table_is_judged_as_the_json_the_command_writes(table: object, reads: bool) -> None:
    config = from_dict({"vllm": {"model": "/m", "args": {"compilation-config": table}}})
    problems = vllmflags.validate_args(config, _known())
    assert (not problems) == reads, problems


def test_an_unknown_key_is_named_with_the_keys_vllm_takes() -> None:
    config = from_dict({"vllm": {"model": "/m", "args": {
        "compilation-config": {"cudagraph_capture_size": [1]}}}})
    problems = vllmflags.validate_args(config, _known())
    assert len(problems) == 1, problems
    text = problems[0].problem
    assert "'cudagraph_capture_size'" in text and "did you mean 'cudagraph_capture_sizes'" in text
    assert "_attention_ops" not in text, text  # the class's own fields are not offered


@pytest.mark.parametrize(("vllm", "reads"), [
    ({"args": {"compilation-config.level": 3}}, False),
    ({"args": {"compilation-config.mode": 3}}, True),
    ({"extra_args": ["--compilation-config.level", "3"]}, False),
    ({"extra_args": ["--compilation-config.cudagraph_capture_sizes+", "1,2"]}, True),
    ({"extra_args": ["--kv-transfer-config.bogus", "1"]}, False),
    ({"extra_args": ["--hf-overrides.anything", "1"]}, True)])  # (a dict: any key)
def test_a_dotted_key_is_one_of_the_classs(vllm: dict[str, Any], reads: bool) -> None:
    # vLLM's parser makes {"level": 3} of --compilation-config.level 3, which 0.32's
    # CompilationConfig refuses (unexpected keyword argument), as vLLM 0.32 itself does
    problems = vllmflags.validate_args(from_dict({"vllm": {"model": "/m", **vllm}}), _known())
    assert (not problems) == reads, problems


@pytest.mark.parametrize(("flag", "word"), [
    ("gpu-memory-utilization", "nan"), ("gpu-memory-utilization", "-inf"),
    ("cpu-offload-gb", "inf"), ("dp-supervisor-probe-timeout-s", "inf")])
def test_nan_and_inf_are_refused_for_what_they_are(flag: str, word: str) -> None:
    # vLLM's float() reads them; no float setting of vLLM 0.32 takes one (gpu-memory-
    # utilization's range check refuses nan, cpu-offload-gb makes int(inf * 2**30) bytes,
    # aiohttp's ceil(inf) fails the probe timeout): it stops at start, not at the parse
    config = from_dict({"vllm": {"model": "/m", "args": {flag: word}}})
    problems = vllmflags.validate_args(config, _known())
    assert len(problems) == 1, problems
    text = problems[0].problem
    assert f"--{flag} {word!r}" in text and "float() reads it" in text and "finite" in text


def _json_parser() -> argparse.ArgumentParser:
    """Flags read as vLLM 0.32 reads its JSON (engine/arg_utils.py: parse_dataclass with its
    class as a default, union_dict_and_str, parse_type(json.loads); LoRAParserAction)."""
    @dataclasses.dataclass
    class Strict:
        mode: int = 0

    def parse_dataclass(val: str, cls: Any = Strict) -> Any:
        data = json.loads(val)
        if set(data) - {"mode"}:
            raise argparse.ArgumentTypeError("unexpected keyword argument")
        return cls(**data)

    def union_dict_and_str(val: str) -> Any:
        return val

    def parse_type(f: Any) -> Any:
        def _parse_type(val: str) -> Any:
            return f(val)
        return _parse_type

    class LoRAParserAction(argparse.Action):
        def __call__(self, *args: Any) -> None:
            pass

    class OwnWords(Strict):
        @classmethod
        def from_cli(cls, val: str) -> Any:  # as vLLM < 0.11's CompilationConfig (`-O3`)
            return cls()

    def parse_own(val: str, cls: Any = OwnWords) -> Any:
        return cls.from_cli(val)
    parse_own.__name__ = "parse_dataclass"

    p = argparse.ArgumentParser()
    p.add_argument("--strict", type=parse_dataclass)
    p.add_argument("--own", type=parse_own)
    p.add_argument("--either", type=union_dict_and_str)
    p.add_argument("--kwargs", type=parse_type(json.loads))
    p.add_argument("--loras", nargs="+", type=str, action=LoRAParserAction)
    return p


def test_the_probe_records_each_json_reader_and_a_classs_keys(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    got = probe_with(_json_parser, monkeypatch, capsys)
    assert got is not None and got.parsers == {
        "strict": "object", "either": "dict_or_str", "kwargs": "json", "loras": "lora"}, got
    assert got.fields == {"strict": ("mode",)} and got.complete, got


def test_a_cache_without_json_readers_is_asked_again() -> None:
    # an earlier answer (readers of numbers only) judged JSON by the built-in rule for ever
    known = _known()
    assert known.complete
    assert not vllmflags.FlagSet(known.version, known.flags, known.switches, known.kinds,
                                 known.aliases, known.lists, known.integers, known.choices,
                                 known.parsers).complete
