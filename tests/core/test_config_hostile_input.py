"""Input a hostile review found that got past the load (2026-12-05), each as its class:
what no TOML reader or vLLM can take is refused at the load with the key and what is
accepted, never a traceback, never a vLLM started with it.

- numbers and nesting tomllib reads but Python refuses (4300 digits, deep arrays);
- vLLM's flags written in vllm.command itself (judged as in extra_args; a key there stays on
  vLLM's command line, a positional replaces vllm.model);
- --config FILE (a YAML of flags no check sees);
- a canary prompt vLLM refuses (empty) or that is no probe (thousands of characters);
- one string past the kernel's 128 KiB for one argument or variable;
- a table with several bad entries: all named at once, and its good entries still judged;
- a value vLLM's own parser refuses, by the flag list (whole numbers, choices, an unknown
  short flag)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vllmwatch import cli
from vllmwatch.config import flags, vllmflags
from vllmwatch.config.convert import MAX_ONE_STRING, SHOW_CHARS
from vllmwatch.config.crosschecks import MAX_CANARY_PROMPT
from vllmwatch.config.schema import ConfigError, from_dict, load
from vllmwatch.core import exitcodes


def _problems(data: dict[str, Any]) -> dict[str, str]:
    data.setdefault("vllm", {}).setdefault("model", "/m")
    with pytest.raises(ConfigError) as exc:
        from_dict(data)
    return {p.key: p.problem for p in exc.value.problems}


@pytest.mark.parametrize("text", [
    '[vllm]\nmodel = "/m"\n[vllm.args]\nmax-model-len = ' + "1" * 5000 + "\n",
    '[vllm]\nmodel = "/m"\nx = ' + "[" * 3000 + "]" * 3000 + "\n",
    '[vllm]\nmodel = "/m"\n[vllm.args]\nx = ' + "{a = " * 2000 + "1" + "}" * 2000 + "\n",
])
def test_what_python_cannot_read_is_a_config_error_not_a_traceback(
        tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "vllmwatch.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load(str(path))
    assert str(path) in str(exc.value) and "invalid TOML" in str(exc.value)
    assert cli.main(["print-command", "--config", str(path)]) == exitcodes.CONFIG
    err = capsys.readouterr().err
    assert "Traceback" not in err and "config error" in err and len(err) < 400, err


@pytest.mark.parametrize(("command", "index", "says"), [
    (["vllm", "serve", "--uds", "/tmp/s"], 2, "Unix socket"),
    (["/opt/v/bin/vllm", "serve", "--api-key", "sk-x"], 2, "ps"),
    (["vllm", "serve", "--api-key=sk-x"], 2, "ps"),
    (["vllm", "serve", "--hf-token", "hf_x"], 2, "HF_TOKEN"),
    (["vllm", "serve", "--served-model-name", "zzz"], 2, "vllm.served_model_name"),
    (["vllm", "serve", "--por", "9000"], 2, "--port abbreviated"),
    (["vllm", "serve", "/other/model"], 2, "instead of vllm.model"),
    (["vllm", "serve", "--max-model-len", "8192", "/other"], 4, "instead of vllm.model"),
    (["vllm", "serve", "--model", "/other"], 2, "vllm.model"),
    (["vllm", "serve", "/m", "/other"], 3, "instead of vllm.model"),
    (["uv", "run", "vllm", "serve", "--host", "0.0.0.0"], 4, "vllm.host"),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "1"], 3, "vllm.port"),
    (["python3", "-m", "vllm.entrypoints.cli.main", "serve", "--help"], 4, "exit 0"),
    (["vllm", "serve", "--config", "/etc/v.yaml"], 2, "YAML"),
    (["vllm", "serve", "--"], 2, "bare --"),
])
def test_vllm_s_flags_in_vllm_command_are_judged(command: list[str], index: int,
                                                 says: str) -> None:
    problems = _problems({"vllm": {"command": command}})
    key = f"vllm.command[{index}]"
    assert key in problems and says in problems[key], problems
    assert "sk-x" not in str(problems) and "hf_x" not in str(problems)


@pytest.mark.parametrize("command", [
    ["vllm", "serve"], ["/opt/vllm/bin/vllm", "serve", "--max-model-len", "8192"],
    ["vllm", "serve", "--enforce-eager", "--tensor-parallel-size", "2"],
    ["numactl", "--cpunodebind=0", "vllm", "serve", "--seed", "1"],
    ["bash", "-c", "exec vllm serve \"$@\"", "vllm"],  # where vLLM begins is not shown: unjudged
    ["python3", "-m", "vllm.entrypoints.openai.api_server"],
    # vllm.model named again there (a file that ran before these checks): what vLLM serves
    ["vllm", "serve", "/m"], ["vllm", "serve", "--model", "/m"], ["vllm", "serve", "--model=/m"],
    ["vllm", "serve", "--max-model-len", "8192", "/m", "--seed", "1"],
])
def test_a_vllm_command_that_passes(command: list[str]) -> None:
    config = from_dict({"vllm": {"model": "/m", "command": command}})
    assert config.vllm.command == command


@pytest.mark.parametrize("where", ["args", "extra_args"])
def test_a_yaml_of_flags_is_refused_with_the_way_to_convert_it(where: str) -> None:
    args, extra = ({"config": "/etc/v.yaml"}, []) if where == "args" else (
        {}, ["--config", "/etc/v.yaml"])
    problems = flags.args_problems(args, extra)  # what check, run and a reload refuse
    assert len(problems) == 1 and "vllmwatch init" in problems[0].problem and \
        "YAML" in problems[0].problem, problems


@pytest.mark.parametrize(("prompt", "refused"), [
    ("", True), ("   ", True), ("\n\t", True), ("x" * (MAX_CANARY_PROMPT + 1), True),
    ("Hello", False), ("x" * MAX_CANARY_PROMPT, False), (" 1+1=", False),
])
def test_a_canary_prompt_vllm_refuses_or_that_is_no_probe(prompt: str, refused: bool) -> None:
    data: dict[str, Any] = {"vllm": {"model": "/m"}, "probe": {"canary_prompt": prompt}}
    if refused:
        problems = _problems(data)
        assert "probe.canary_prompt" in problems and len(problems["probe.canary_prompt"]) < 400
    else:
        assert from_dict(data).probe.canary_prompt == prompt


@pytest.mark.parametrize(("vllm", "key"), [
    ({"env": {"BIG": "x" * (MAX_ONE_STRING + 1)}}, "vllm.env"),
    ({"args": {"chat-template": "x" * (MAX_ONE_STRING + 1)}}, "vllm.args"),
    ({"extra_args": ["--chat-template", "é" * (MAX_ONE_STRING // 2 + 1)]}, "vllm.extra_args"),
    ({"command": ["vllm", "serve", "--x", "x" * (MAX_ONE_STRING + 1)]}, "vllm.command"),
])
def test_one_string_past_the_kernel_s_limit_is_refused_and_not_echoed(
        vllm: dict[str, Any], key: str) -> None:
    problems = _problems({"vllm": vllm})
    assert key in problems and "128 KiB" not in problems[key] and "at most" in problems[key]
    assert all(len(p) < 2000 for p in problems.values()), "the value was echoed whole"


def test_a_long_bad_value_is_shown_cut_with_its_length() -> None:
    problems = _problems({"vllm": {"host": "h" * 100_000}})
    assert len(problems["vllm.host"]) < SHOW_CHARS + 400 and "100000 characters" in \
        problems["vllm.host"]


def test_every_bad_entry_of_a_table_is_named_and_the_good_ones_still_judged() -> None:
    problems = _problems({"vllm": {
        "env": {"A": True, "1B": "x", "C": [1], "OK": "fine"},
        "args": {"port": 1, "host": "x", "x": __import__("datetime").date(2020, 1, 1)}}})
    env = problems["vllm.env"]
    assert "A = true" in env and "'1B'" in env and "C = an array" in env and "OK" not in env
    assert "TOML date" in problems["vllm.args"]
    assert "vllm.port" in problems["vllm.args.port"] and "vllm.host" in problems[
        "vllm.args.host"]


@pytest.mark.parametrize(("args", "extra", "says"), [
    ({"max-model-len": 1.5}, [], "whole number"),
    ({"max-model-len": "1e3"}, [], "whole number"),
    ({"seed": 1e308}, [], "whole number"),
    ({}, ["--seed", "1e308"], "whole number"),
    ({}, ["--max-num-seqs=2.5"], "whole number"),
    ({"max-model-len": "1.5K"}, [], "whole number"),  # no decimals with a binary suffix
    ({"dtype": "float17"}, [], "choose one of"),
    ({"dtype": "fp16"}, [], "choose one of"),
    ({}, ["--uvicorn-log-level", "loud"], "choose one of"),
    ({}, ["-x"], "not a flag"),
    ({}, ["-V"], "not a flag"),
    ({}, ["-tp", "1", "-q=awq", "-Z"], "not a flag"),
    ({"compilation-config": 3}, [], "--optimization-level"),
    ({}, ["--compilation-config", "3"], "--optimization-level"),
])
def test_values_vllm_s_own_parser_refuses(args: dict[str, object], extra: list[str],
                                          says: str) -> None:
    from tests.shell.test_init import known
    config = from_dict({"vllm": {"model": "/m", "args": args, "extra_args": extra}})
    problems = vllmflags.validate_args(config, known())
    assert len(problems) == 1 and says in problems[0].problem, problems


@pytest.mark.parametrize(("args", "extra"), [
    ({"max-model-len": 8192, "seed": 0, "gpu-memory-utilization": 0.9}, []),
    ({"max-model-len": "32k", "max-num-batched-tokens": "25.6k"}, []),
    ({"max-model-len": "auto"}, ["--max-num-seqs", "-1"]),
    ({"max-model-len": "2K"}, ["--dtype", "bfloat16", "-tp", "1", "-O", "3"]),
    ({"dtype": "half"}, ["--uvicorn-log-level=warning"]),
    ({"compilation-config": {"cudagraph_mode": "PIECEWISE"}}, ["-O3"]),
])
def test_values_vllm_s_own_parser_reads(args: dict[str, object], extra: list[str]) -> None:
    from tests.shell.test_init import known
    config = from_dict({"vllm": {"model": "/m", "args": args, "extra_args": extra}})
    assert vllmflags.validate_args(config, known()) == []


def test_vllm_s_flags_in_vllm_command_meet_the_flag_list() -> None:
    from tests.shell.test_init import known
    config = from_dict({"vllm": {"model": "/m", "command": [
        "vllm", "serve", "--max-num-seqs", "1k", "--bogus-flag", "1"]}})  # (1k: int() refuses
    # it in vLLM 0.32, where an older vLLM's human_readable_int took it: the list's to judge)
    problems = {p.key: p.problem for p in vllmflags.validate_args(config, known())}
    assert "whole number" in problems["vllm.command[2]"] and \
        "not a flag" in problems["vllm.command[4]"], problems


def test_a_flag_list_without_aliases_judges_no_short_flag() -> None:
    """A cache of an older vllmwatch has no aliases: a short flag it cannot name is left to
    vLLM (the launch reads that cache: refusing it would stop a config that ran before)."""
    import dataclasses

    from tests.shell.test_init import known
    config = from_dict({"vllm": {"model": "/m", "extra_args": ["-zz", "2"]}})
    assert vllmflags.validate_args(config, dataclasses.replace(known(), aliases={})) == []
    assert vllmflags.validate_args(config, known())[0].problem.startswith("-zz is not")


@pytest.mark.parametrize(("text", "shown"), [
    ("timeout = 00:30:00", "bad value 00:30:00 (a TOML time)"),  # half an hour, unquoted
    ("timeout = 1979-05-27", "bad value 1979-05-27 (a TOML date)"),
    ("timeout = 1979-05-27T07:32:00Z", "bad value 1979-05-27T07:32:00+00:00 (a TOML date-time)"),
])
def test_a_toml_date_or_time_is_named_as_written_not_as_pythons_repr(
        tmp_path: Path, text: str, shown: str) -> None:
    path = tmp_path / "v.toml"
    path.write_text(f'[vllm]\nmodel = "/m"\n[startup]\n{text}\n')
    with pytest.raises(ConfigError) as got:
        load(str(path))
    assert f"v.toml:4: startup.timeout: {shown}; expected seconds" in str(got.value)
    assert "datetime." not in str(got.value)


@pytest.mark.parametrize(("text", "name"), [
    ('[vllm]\nmodel = "/m"\ncommand = ["vllm", "serve"]\ncommand = ["vllm", "serve"]', "command"),
    ('[vllm]\nmodel = "/m"\n[vllm.env]\nHF_HOME = "/a"\nHF_HOME = "/b"\n\n', "HF_HOME"),
    ('[vllm]\nmodel = "/m"\n[probe]\ninterval = 5\n[vllm]\nport = 8001\n', "[vllm]"),
    ('[vllm]\nmodel = "/m"\nenv = { HF_HOME = "/a" }\n[vllm.env]\nX = "1"\n', "[vllm.env]"),
    ('[vllm]\nmodel = "/m"\nargs.max-model-len = 8192\n[vllm.args]\nseed = 1\n', "[vllm.args]"),
])
def test_a_key_set_twice_is_named(tmp_path: Path, text: str, name: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """tomllib says only `Cannot overwrite a value (at end of document)` or `Cannot declare
    ('vllm',) twice`: the key or table on that line is named, with what to do."""
    path = tmp_path / "vllmwatch.toml"
    path.write_text(text)
    assert cli.main(["print-command", "--config", str(path)]) == exitcodes.CONFIG
    err = capsys.readouterr().err
    assert str(path) in err and f"{name!r} on that line is set twice" in err, err
    assert "keep one" in err and "Traceback" not in err


@pytest.mark.parametrize(("section", "name", "table"), [
    ("vllm", "smoke", "[[smoke]]"), ("vllm", "gate", "[gate]"), ("probe", "memory", "[memory]"),
    ("restart", "adapters", "[[adapters]]")])
def test_a_section_written_below_another_header_is_named_as_such(section: str, name: str,
                                                                  table: str) -> None:
    """`smoke = [{..}]` below [vllm] is vllm.smoke in TOML: the guess was `did you mean
    vllm.model?`, which sent the person to the wrong key."""
    from vllmwatch.config.redact import REDACT

    data: dict[str, Any] = {"vllm": {"model": "/m"}}
    data.setdefault(section, {})[name] = [{"endpoint": "chat"}] if table.startswith("[[") \
        else {"enabled": True}
    problem = _problems(data)[f"{section}.{name}"]
    assert f"{name} is a section of its own" in problem and table in problem, problem
    assert "did you mean" not in problem and REDACT.text(problem) == problem


@pytest.mark.parametrize(("raw", "line", "key"), [
    (b'[vllm]\nmodel = "/m"\n[vllm.env]\nNAME = "caf\xe9"\n', 4, ", key NAME"),
    (b'[vllm]\nmodel = "/m"\n# caf\xe9\n', 3, ""),
    (b'[vllm]\nmodel = "/m"\n[vllm.env]\nX = """\nS3cr\xe9t\n"""\n', 5, "")])  # (no text shown)
def test_a_byte_that_is_not_utf8_is_placed_by_line(tmp_path: Path, raw: bytes, line: int,
                                                   key: str) -> None:
    """A Latin-1 file (an editor's `café`) said only `at byte 42`, which no editor goes to."""
    path = tmp_path / "vllmwatch.toml"
    path.write_bytes(raw)
    with pytest.raises(ConfigError) as exc:
        load(str(path))
    said = str(exc.value)
    assert f"{path}:{line}:" in said and f"line {line}{key});" in said and "UTF-8" in said, said
    assert "S3cr" not in said


@pytest.mark.parametrize(("key", "says"), [
    # vLLM's parser reads `--NAME.k V` as --NAME '{"k": V}' and takes a prefix of a flag:
    # `"a.b" = 1` stopped vLLM at each launch (`ambiguous option: --a`), `"api-key.k"` put the
    # key on vLLM's argv in clear (its API key the JSON object), `"por.k"` stopped vLLM
    ("a.b", "--a is --api-key abbreviated"),
    ("api-key.k", "--api-key set to a JSON object"),
    ("api_k.k", "--api-k is --api-key abbreviated"),
    ("hf-token.k", "--hf-token set to a JSON object"),
    ("por.k", "use vllm.port"),
    ("port.k", "use vllm.port"),
    ("served-model-name.k", "use vllm.served_model_name"),
])
def test_a_dotted_key_is_judged_by_the_flag_vllm_reads_before_its_dot(key: str, says: str
                                                                     ) -> None:
    from vllmwatch.config import command
    config = from_dict({"vllm": {"model": "/m", "args": {key: "Zq9SecretK1"}}})
    with pytest.raises(ConfigError) as exc:  # the launch's own judgement: no vLLM started
        command.build(config, {})
    problems = {p.key: p.problem for p in exc.value.problems}
    assert says in problems[f"vllm.args.{key}"], problems
    assert "Zq9SecretK1" not in str(problems)
    config = from_dict({"vllm": {"model": "/m", "args": {"hf-overrides.rope_theta": 1e6}}})
    assert config.vllm.args == {"hf-overrides.rope_theta": 1e6}  # a JSON flag's key: read
