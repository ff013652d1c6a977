"""What an operator feeds vllmwatch, from a hostile review of the config and the CLI
(2026-12-07), each as its class:

- an unknown key of any table ([SECTION], [[smoke]], [[adapters]]) names the key it most
  likely meant, whatever its case or its `-`/`_` (`MAX_RESTARTS`, `[VLLM]`, `Endpoint`), and
  a vLLM flag written right below [vllm] says it goes under [vllm.args];
- a config path that is not UTF-8 is a config error at the load, not exit 70 at `run`'s
  instance lock (nor `check`'s "cannot load: UnicodeEncodeError") after the load passed;
- vllm.env_file's lines end at a line feed, as an editor's do (str.splitlines() also ended
  one inside a value), and a byte-order mark at the start of it or of the key file is
  skipped, as in the config, not read as part of the first name or the key;
- `incidents --dir` given something that is no folder (the config, a FIFO, a link loop)
  is a usage error, not "no incident records" and exit 0;
- a section written as an array of tables (`[[probe]]`) is named at its header, with the
  one pair of brackets it takes, and none of its keys is also called missing;
- vllm.command's program is what the service can exec: a name on PATH or a path from /
  (a relative one passed `check` in its folder and failed the service: spawn_failed, 78),
  with no shell's `~` or `$VAR`, no program and its words in one item;
- a file of thousands of problems is judged in one pass over its text (it took minutes) and
  said in bounds: the first 50 problems, 10 bad entries of a table, a long name cut."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from vllmwatch import cli
from vllmwatch.config import adapters, command, smoke
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


_BREAKS = ["\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def _with_file(tmp_path: Path, key: str, data: bytes) -> str:
    secret = tmp_path / "secret"
    secret.write_bytes(data)
    os.chmod(secret, 0o600)
    path = tmp_path / "v.toml"
    path.write_text(f'[vllm]\nmodel = "/m"\ncommand = ["vllm", "serve"]\n{key} = "{secret}"\n')
    return str(path)


def _env(path: str) -> dict[str, str]:
    config = load(path)
    return dict(command.build(config, {}, api_key=command.read_api_key(config)).env)


@pytest.mark.parametrize("mark", _BREAKS)
def test_an_env_file_line_ends_at_a_line_feed_only(tmp_path: Path, mark: str) -> None:
    text = f"HF_TOKEN=hf_a{mark}VLLM_API_KEY=sk-b\nOTHER=1\n"
    env = _env(_with_file(tmp_path, "env_file", text.encode()))
    assert env["HF_TOKEN"] == f"hf_a{mark}VLLM_API_KEY=sk-b" and env["OTHER"] == "1"
    assert "VLLM_API_KEY" not in env  # no variable made of a value's text


@pytest.mark.parametrize("mark", _BREAKS)
def test_an_env_file_s_bad_line_is_the_line_an_editor_shows(tmp_path: Path,
                                                            mark: str) -> None:
    path = _with_file(tmp_path, "env_file", f"A=1{mark}2\nB=3\nnot a line\n".encode())
    with pytest.raises(command.KeyFileError, match="line 3: expected NAME=value") as got:
        _env(path)
    assert not got.value.transient


@pytest.mark.parametrize(("key", "data"), [
    ("env_file", b"\xef\xbb\xbfHF_TOKEN=hf_abc\n"),
    ("env_file", b"\xef\xbb\xbf# Notepad\r\nHF_TOKEN=hf_abc\r\n"),
    ("api_key_file", b"\xef\xbb\xbfsk-abc\r\n"),
])
def test_a_byte_order_mark_is_no_part_of_a_secret_file_s_first_line(
        tmp_path: Path, key: str, data: bytes) -> None:
    path = _with_file(tmp_path, key, data)
    env = _env(path)
    if key == "env_file":
        assert env["HF_TOKEN"] == "hf_abc"
    else:
        assert command.read_api_key(load(path)) == "sk-abc" == env["VLLM_API_KEY"]
    command.load_for_reload(path)  # and a reload takes it


def _not_a_folder(tmp_path: Path, kind: str) -> str:
    path = tmp_path / "incidents"
    if kind == "file":
        path.write_text('[vllm]\nmodel = "/m"\n')  # the config, given by mistake
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "under a file":
        path.write_text("")
        path = path / "incidents"
    else:
        path.symlink_to(path)
    return str(path)


@pytest.mark.parametrize("kind", ["file", "fifo", "loop", "under a file"])
@pytest.mark.parametrize("more", [[], ["--json"], ["show", "20260101T000000Z-crash"]])
def test_incidents_dir_that_is_no_folder_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, more: list[str]) -> None:
    path = _not_a_folder(tmp_path, kind)
    assert cli.main(["incidents", "--dir", path, *more]) == 2
    err = capsys.readouterr().err
    assert f"--dir {path!r} is not a folder" in err and "no incident records" not in err, err


@pytest.mark.parametrize("link", [False, True])
def test_incidents_dir_not_made_yet_has_no_records(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], link: bool) -> None:
    path = tmp_path / "incidents"
    if link:  # (a link to a state directory not made yet)
        path.symlink_to(tmp_path / "state" / "incidents")
    assert cli.main(["incidents", "--dir", str(path)]) == 0
    assert "no incident records" in capsys.readouterr().err


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_a_section_written_as_an_array_of_tables_is_named_at_its_header(
        tmp_path: Path, section: str) -> None:
    first = "" if section == "vllm" else '[vllm]\nmodel = "/m"\n\n'
    path = tmp_path / "v.toml"
    path.write_text(f"{first}[[{section}]]\n[[{section}]]\n")
    with pytest.raises(ConfigError) as exc:
        load(str(path))
    problems = exc.value.problems
    assert [(p.key, p.line) for p in problems] == [(section, first.count("\n") + 1)], problems
    assert problems[0].problem == (
        f"expected a table [{section}], got [[{section}]], an array of tables; write "
        f"[{section}] with one pair of brackets: the section is one table")


@pytest.mark.parametrize(("program", "says"), [
    ("./venv/bin/vllm", "a relative path; write it from /"),
    ("venv/bin/python", "a relative path; write it from /"),
    ("../vllm/bin/vllm", "a relative path; write it from /"),
    ("~/venv/bin/vllm", "a shell expands ~"),
    ("~vllm/bin/vllm", "a shell expands ~"),
    ("$HOME/venv/bin/vllm", "a shell expands $"),
    ("${VENV}/bin/vllm", "a shell expands $"),
    ("vllm serve", "a program and its words in one item"),
    ("vllm ", "a space at an end"),
    (" /opt/vllm/bin/vllm", "a space at an end"),
    ("vllm\n", "a control character"),
    ("/opt/vllm/bin/vllm\x1b", "a control character"),
])
def test_a_program_the_service_cannot_exec_is_refused_at_the_load(program: str,
                                                                  says: str) -> None:
    problem = _problems({"vllm": {"model": "/m", "command": [program, "serve"]}})[
        "vllm.command"]
    assert f"item 0 {program!r}: {says}" in problem, problem


@pytest.mark.parametrize("command", [
    ["vllm", "serve"], ["/opt/vllm/bin/vllm", "serve"], ["/opt/my venv/bin/vllm", "serve"],
    ["python3", "-m", "vllm.entrypoints.openai.api_server"], ["/usr/bin/env", "vllm", "serve"],
])
def test_a_program_on_path_or_from_the_root_passes(command: list[str]) -> None:
    assert from_dict({"vllm": {"model": "/m", "command": command}}).vllm.command == command


_MANY = {
    "probe": lambda i: f"k{i} = 1",
    "vllm.env": lambda i: f"K{i} = [1]",
    "vllm.args": lambda i: f'"k {i}" = 1',
}


@pytest.mark.parametrize("table", sorted(_MANY))
def test_a_file_of_thousands_of_problems_is_judged_at_once_and_said_in_bounds(
        tmp_path: Path, table: str) -> None:
    """4000 unknown keys took minutes (each problem's line was searched for through the
    whole text: 16 million lines read), and every problem was said: megabytes of message."""
    import time

    lines = [_MANY[table](i) for i in range(4000)]
    path = tmp_path / "v.toml"
    path.write_text('[vllm]\nmodel = "/m"\n' + f"[{table}]\n" + "\n".join(lines) + "\n")
    began = time.monotonic()
    with pytest.raises(ConfigError) as exc:
        load(str(path))
    assert time.monotonic() - began < 10
    text = str(exc.value)
    assert len(text) < 20_000 and ("more (fix these first)" in text or "and 3990 more" in text)
    if table == "probe":  # each still placed at its own line
        assert [p.line for p in exc.value.problems] == list(range(4, 4004))


@pytest.mark.parametrize("where", ["[probe]\n{k} = 1", "[vllm.env]\n{k}_ = 1",
                                   '[vllm.env]\n"{k}-" = 1', '[vllm.args]\n"{k}!" = 1',
                                   "[vllm.args]\n{k} = 1", "[{k}]",
                                   '[[smoke]]\nendpoint = "chat"\n{k} = 1',
                                   '[[adapters]]\nname = "a"\npath = "/a"\n{k} = 1'])
def test_a_long_name_is_said_cut_with_its_length(tmp_path: Path, where: str) -> None:
    path = tmp_path / "v.toml"
    path.write_text('[vllm]\nmodel = "/m"\n' + where.format(k="x" * 300_000) + "\n")
    with pytest.raises(ConfigError) as exc:
        load(str(path))
    text = str(exc.value)
    assert len(text) < 3000 and "characters)" in text, text[:3000]
