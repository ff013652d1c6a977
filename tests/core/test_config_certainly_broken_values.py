"""A value of a vLLM flag that no vLLM takes is a config error even where vLLM's own flag list
is not known (config/flagnames.py: its best-known switches, numbers and choices, and the
words that follow no flag). Before, with no flag list, `print-command` exited 0 and printed a
command vLLM refused at every start (`extra_args = ["-"]`, `["--max-model-len", ""]`,
`max-model-len = {a=1}`, `enforce-eager = "yes"`, ...), and `init` wrote `--enforce-eager=foo`
as enforce-eager = "foo" (and read `vllm serve --enforce-eager /m` as no model). Where the
list is known (vLLM 0.32's fixture) it refuses each of them too: the two agree."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import tomllib

from tests.shell.test_init import init, known
from vllmwatch import cli
from vllmwatch.config import flagnames, flags, units, vllmflags
from vllmwatch.config.schema import from_dict
from vllmwatch.core import exitcodes
from vllmwatch.migrate.draft import Facts

# (a [vllm] table's lines, the key refused, a word of what is accepted)
BROKEN = [
    ('extra_args = ["-"]', "vllm.extra_args[0]", "a lone -"),
    ('extra_args = ["--enforce-eager", "-"]', "vllm.extra_args[0]", "switch"),
    ('extra_args = ["--max-model-len", "4096", "-"]', "vllm.extra_args[2]", "a lone -"),
    ('extra_args = ["--max-model-len", ""]', "vllm.extra_args[0]", "whole number"),
    ('extra_args = ["--max-model-len="]', "vllm.extra_args[0]", "whole number"),
    ('extra_args = ["--gpu-memory-utilization", " "]', "vllm.extra_args[0]", "a number"),
    ('extra_args = ["--max-model-len", "lots"]', "vllm.extra_args[0]", "whole number"),
    ('extra_args = ["--max-model-len", "4096", "/other"]', "vllm.extra_args[2]", "second model"),
    ('extra_args = ["--max-model-len=4096", "x"]', "vllm.extra_args[1]", "second model"),
    ('extra_args = ["-tp", "2", "x"]', "vllm.extra_args[2]", "second model"),
    ('extra_args = ["--enforce-eager=foo"]', "vllm.extra_args[0]", "switch"),
    ('extra_args = ["--enforce-eager="]', "vllm.extra_args[0]", "switch"),
    ('extra_args = ["--trust-remote-code", "x"]', "vllm.extra_args[0]", "switch"),
    ('extra_args = ["--dtype", "fp16"]', "vllm.extra_args[0]", "bfloat16"),
    ("[vllm.args]\nmax-model-len = {a=1}", "vllm.args.max-model-len", "whole number"),
    ("[vllm.args]\nmax-model-len = [1, 2]", "vllm.args.max-model-len", "whole number"),
    ('[vllm.args]\nmax-model-len = ""', "vllm.args.max-model-len", "whole number"),
    ("[vllm.args]\nmax-model-len = 4096.0", "vllm.args.max-model-len", "whole number"),
    ("[vllm.args]\ntensor-parallel-size = 2.0", "vllm.args.tensor-parallel-size", "whole"),
    ('[vllm.args]\ngpu-memory-utilization = "auto90"', "vllm.args.gpu-memory-utilization",
     "a number"),
    ("[vllm.args]\ngpu-memory-utilization = {}", "vllm.args.gpu-memory-utilization",
     "a number"),
    ('[vllm.args]\nenforce-eager = "yes"', "vllm.args.enforce-eager", "switch"),
    ("[vllm.args]\nenforce-eager = 1", "vllm.args.enforce-eager", "switch"),
    ("[vllm.args]\nenable-prefix-caching = {}", "vllm.args.enable-prefix-caching", "switch"),
    ("[vllm.args]\ncudagraph-capture-sizes = [1, 2, 4]", "vllm.args.cudagraph-capture-sizes",
     "vllm.extra_args"),
    ('[vllm.args]\ndtype = "fp16"', "vllm.args.dtype", "bfloat16"),
    ("[vllm.args]\ndtype = {a = 1}", "vllm.args.dtype", "bfloat16"),
]

# What some vLLM takes: never refused without the list (nor, these, with 0.32's)
TAKEN = [
    'extra_args = ["--max-model-len", "32k", "--seed", "-1", "--enforce-eager"]',
    'extra_args = ["--max-model-len=auto", "--gpu-memory-utilization=.9", "--dtype", "half"]',
    'extra_args = ["--cudagraph-capture-sizes", "1", "2", "4", "--enforce-eager"]',
    'extra_args = ["--tokenizer", "-", "--chat-template", ""]',  # (its own value: any word)
    'extra_args = ["--some-future-flag", "x", "y", "--other=1"]',  # (not known: not judged)
    'extra_args = ["--compilation-config.level", "3"]',
    "[vllm.args]\nmax-model-len = 8192\nseed = \"\"\ntensor-parallel-size = 2\n"
    "gpu-memory-utilization = 1\nenforce-eager = true\nenable-prefix-caching = false\n"
    "hf-overrides = { rope_parameters = { rope_type = \"yarn\" } }\n"
    "limit-mm-per-prompt = { image = 2 }\ncompilation-config = { level = 3 }\n"
    "override-generation-config = { temperature = 0.5 }\n"
    "speculative-config = { method = \"ngram\", num_speculative_tokens = 3 }",
]


def _write(tmp_path: Path, lines: str) -> Path:
    path = tmp_path / "a.toml"
    path.write_text('[vllm]\nmodel = "/m"\ncommand = ["/nonexistent/bin/vllm", "serve"]\n'
                    f"{lines}\n")
    return path


@pytest.mark.parametrize(("lines", "key", "says"), BROKEN)
def test_print_command_refuses_what_no_vllm_takes_without_its_flag_list(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: str, key: str,
        says: str) -> None:
    path = _write(tmp_path, lines)  # (no vLLM there: its flag list cannot be learnt)
    assert cli.main(["print-command", "-c", str(path)]) == exitcodes.CONFIG
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err, err
    assert f"{path}" in err and f"{key}:" in err and says in err, err


@pytest.mark.parametrize(("lines", "key", "says"), BROKEN)
def test_the_flag_list_refuses_each_of_them_too(lines: str, key: str, says: str) -> None:
    data = tomllib.loads(f'[vllm]\nmodel = "/m"\n{lines}')
    args, extra = data["vllm"].get("args", {}), data["vllm"].get("extra_args", [])
    config = from_dict({"vllm": {"model": "/m"}})  # (its args unjudged by the load)
    config = dataclasses.replace(config, vllm=dataclasses.replace(
        config.vllm, args=args, extra_args=extra))
    assert vllmflags.validate_args(config, known()), lines


@pytest.mark.parametrize("lines", TAKEN)
def test_what_some_vllm_takes_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     lines: str) -> None:
    path = _write(tmp_path, lines)
    assert cli.main(["print-command", "-c", str(path)]) == 0, capsys.readouterr().err
    data = tomllib.loads(path.read_text())["vllm"]
    assert flags.args_problems(data.get("args", {}), data.get("extra_args", [])) == []


def test_the_built_in_kinds_are_vllm_0_32_s() -> None:
    """Each switch, number and choice here is one in vLLM 0.32's own list (a flag it lacks
    aside), so that the load without the list never refuses what 0.32 takes."""
    data = json.loads((Path(__file__).resolve().parent.parent / "shell" / "fixtures"
                       / "vllm-0.32.0-flags.json").read_text())
    assert set(data["switches"]) >= flagnames.SWITCHES
    for name in flagnames.NUMBERS:
        assert name not in data["flags"] or data["kinds"][name] == "number", name
    for name, choices in flagnames.CHOICES.items():
        assert set(choices) == set(data["choices"][name]), name
    for name in flagnames.NUMBERS:  # (each word 0.32 reads, read here too)
        for word in ("8192", "-1", "32k", "25.6k", "auto", "0.9", "1e3", "+5", "1_000"):
            spec = data["parsers"].get(name)
            if spec is None:
                continue
            try:
                units.vllm_read(spec, word)
            except ValueError:
                continue
            assert flagnames.value_problem(name, word, "k") is None, (name, word)


@pytest.mark.parametrize(("line", "flag", "value"), [
    ("vllm serve m --enforce-eager=foo", "enforce-eager", None),
    ("vllm serve m --enforce-eager=", "enforce-eager", None),
    ("vllm serve /m --max-model-len lots", "max-model-len", None),
    ("vllm serve /m --tensor-parallel-size 2.0", "tensor-parallel-size", None),
    ("vllm serve /m --dtype fp16", "dtype", None),
    ("vllm serve --enforce-eager /m", "enforce-eager", True),  # (/m is the model)
])
def test_init_without_the_flag_list_writes_no_value_the_load_refuses(
        line: str, flag: str, value: object) -> None:
    vllm, toml, draft = init(line, Facts())  # (init() loads what it wrote)
    assert vllm.get("args", {}).get(flag) == value, toml
    assert vllm["model"] in ("m", "/m")
    if value is None:
        assert any(f"--{flag}" in e for e in draft.errors), draft.errors


def test_no_kv_cache_dtype_of_vllm_0_32_is_refused_without_the_list() -> None:
    """The built-in choices held 0.31's: `kv-cache-dtype = "nvfp4"`, which 0.32 takes, was
    refused by the load wherever 0.32's own list was not cached."""
    data = json.loads((Path(__file__).resolve().parent.parent / "shell" / "fixtures"
                       / "vllm-0.32.0-flags.json").read_text())
    for word in data["choices"]["kv-cache-dtype"]:
        assert flags.flag_problem("kv-cache-dtype", word, "k") is None, word
