"""Issue 23 §3: only flags that take JSON are parsed as JSON (vLLM's flag list says which; a
built-in list when nothing is cached), the cache of an older vllmwatch still reads, and
vllm.port, status.listen and gate.listen must be three different sockets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vllmwatch.config import flags, vllmflags
from vllmwatch.config.command import args_to_argv
from vllmwatch.config.schema import ConfigError, from_dict

JINJA = "{% for m in messages %}{{ m.content }}{% endfor %}"
KNOWN = vllmflags.FlagSet("0.99.0", frozenset({"chat-template", "hf-overrides", "my-json",
                                                "enforce-eager", "no-enforce-eager"}),
                          frozenset({"enforce-eager", "no-enforce-eager"}),
                          {"chat-template": "text", "hf-overrides": "json", "my-json": "json",
                           "enforce-eager": "bool", "no-enforce-eager": "bool"})


@pytest.mark.parametrize("args,refused", [
    ({"chat-template": JINJA}, False),  # vLLM's documented single-line template
    ({"chat-template": "[INST] {{ x }}"}, False),
    ({"hf-overrides": "{not json"}, True),
    ({"compilation-config": "[1, 2"}, True),
    ({"hf-overrides": '{"a": 1}'}, False),
])
def test_json_only_for_json_flags_without_a_flag_list(args: dict[str, object],
                                                      refused: bool) -> None:
    assert bool(flags.args_problems(args, ())) == refused
    if not refused:
        assert args_to_argv(args)[1] == next(iter(args.values()))  # text passed as it is


@pytest.mark.parametrize("name,value,refused", [
    ("chat-template", JINJA, False),
    ("my-json", "{bad", True),  # JSON by vLLM's own list, not by the built-in one
    ("my-json", '{"ok": 1}', False),
    ("hf-overrides", "{bad", True),
])
def test_json_by_the_flag_list(name: str, value: str, refused: bool) -> None:
    config = from_dict({"vllm": {"model": "m", "args": {name: value}}})
    assert bool(vllmflags.validate_args(config, KNOWN)) == refused


def test_the_config_loads_a_jinja_template() -> None:
    config = from_dict({"vllm": {"model": "m", "args": {"chat-template": JINJA}}})
    assert config.vllm.args["chat-template"] == JINJA


def _key(tmp: Path) -> Path:
    import hashlib
    import sys

    key = hashlib.sha256(f"0.99.0\0{sys.executable}".encode()).hexdigest()[:16]
    return tmp / f"{key}.json"


def test_an_old_cache_without_kinds_still_reads_and_uses_the_built_in_json_list(
        tmp_path: Path) -> None:
    import sys

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    _key(cache).write_text(json.dumps({"version": "0.99.0", "flags": ["hf-overrides", "seed"],
                                       "switches": []}))
    got = vllmflags.known_flags([sys.executable], "0.99.0", str(cache), ask=False)
    assert got is not None and got.kinds == {}
    assert got.json_flags == flags.BUILTIN_JSON and got.kind("hf-overrides") == "json"
    assert got.kind("seed") == "text" and got.kind("nope") is None


@pytest.mark.parametrize("table,kinds", [
    ({"kinds": {"seed": "number", "x": "json", "e": "bool", "w": "weird"},
      "aliases": {"-tp": "tensor-parallel-size"}},
     {"seed": "number", "x": "json", "e": "bool", "w": "text"}),
    ({"seed": False}, None),  # not the format this probe prints
])
def test_the_probes_answer(table: dict[str, Any], kinds: dict[str, str] | None) -> None:
    got = vllmflags._from_probe("0.99.0", table)
    assert (got.kinds if got else None) == kinds
    if got:
        assert got.switches == {"e"} and got.aliases == {"-tp": "tensor-parallel-size"}


@pytest.mark.parametrize("data,key", [
    ({"vllm": {"port": 9101}}, "status.listen"),
    ({"vllm": {"port": 9101, "host": "0.0.0.0"}}, "status.listen"),
    ({"status": {"listen": "localhost:8000"}}, "status.listen"),
    ({"gate": {"enabled": True, "listen": "127.0.0.1:9101"}}, "gate.listen"),
    ({"gate": {"enabled": True, "listen": ":9101"}}, "gate.listen"),
    ({"gate": {"enabled": True, "listen": "0.0.0.0:8000"}}, "gate.listen"),
])
def test_conflicting_addresses_are_refused_at_load(data: dict[str, Any], key: str) -> None:
    data.setdefault("vllm", {})["model"] = "m"
    with pytest.raises(ConfigError) as exc:
        from_dict(data)
    assert f"{key}:" in str(exc.value), str(exc.value)


@pytest.mark.parametrize("data", [
    {"vllm": {"port": 9101, "host": "10.0.0.1"}},  # another address: no clash
    {"gate": {"enabled": True, "listen": "0.0.0.0:8080"}},
    {"gate": {"enabled": False, "listen": "127.0.0.1:9101"}},  # off: not bound
    {"status": {"listen": ""}, "vllm": {"port": 9101}},
])
def test_distinct_addresses_load(data: dict[str, Any]) -> None:
    data.setdefault("vllm", {})["model"] = "m"
    from_dict(data)


@pytest.mark.parametrize(("extra", "says"), [
    (["\u2014enforce-eager"], "typographic dash"),  # an em dash, pasted from a web page
    (["--max-model-len 8192"], "are one word to vLLM"),
    (["--port 9000"], "is set by vllmwatch; use vllm.port"),  # was let through as one word
    (["--api-key sk-one-word"], "are one word to vLLM"),
    (["stray", "--enforce-eager"], "comes before any flag"),
    (["--enforce-eager", "-h"], "exit 0 without serving"),  # -h is --help to vLLM
    (["--api-key", "sk-one-word", "sk-two"], "more than one key"),  # the second stayed
    (["--api-key=sk-one-word", "sk-two", "--enforce-eager"], "more than one key"),  # on argv
])
def test_extra_args_words_vllm_cannot_read_are_refused(extra: list[str], says: str) -> None:
    problems = flags.args_problems({}, extra)
    assert any(says in p.problem for p in problems), problems
    assert all("sk-one-word" not in p.problem and "sk-two" not in p.problem for p in problems)


@pytest.mark.parametrize("extra", [["--enforce-eager"], ["--served-model-name-x", "a b"],
                                   ["--middleware", "pkg.a", "--middleware", "pkg.b"],
                                   ["--max-model-len=8192"],
                                   ["--api-key", "sk-one", "--enforce-eager"]])
def test_extra_args_vllm_reads_pass(extra: list[str]) -> None:
    assert flags.args_problems({}, extra) == []


@pytest.mark.parametrize(("name", "value", "refused"), [
    ("max-model-len", "abc", True), ("gpu-memory-utilization", "high", True),
    ("max-num-seqs", True, True),
    ("max-model-len", "32k", False), ("max-model-len", "auto", False),
    ("gpu-memory-utilization", 0.9, False), ("max-model-len", "8192", False),
    ("max-model-len", -1, False), ("kv-cache-memory-bytes", "None", False),
    # vLLM 0.32's --seed is read by int() alone (not optional_type): `invalid int value`
    ("seed", "1e3", True), ("seed", "None", True),
])
def test_a_number_flag_takes_what_vllm_reads_as_a_number(name: str, value: object,
                                                         refused: bool) -> None:
    """The reload gate and check passed `max-model-len = "abc"` although the cached flag
    list says the flag takes a number: vLLM then stopped at every launch."""
    from tests.shell.test_init import known
    problem = vllmflags.flag_problem(name, value, f"vllm.args.{name}", known())
    assert (problem is not None and ("is not one" in problem.problem or "is given none" in
                                     problem.problem)) is refused, problem


# What vLLM 0.32's own parser was given and read (int(), float(), human_readable_int):
# `vllm serve /m --gpu-memory-utilization .9` served, and check failed it, `run` refused it.
@pytest.mark.parametrize(("name", "value"), [
    ("gpu-memory-utilization", ".9"), ("gpu-memory-utilization", "1."),
    ("gpu-memory-utilization", "9e-1"), ("max-num-seqs", "1_000"), ("max-num-seqs", "+5"),
    ("max-num-batched-tokens", " 8192"), ("max-model-len", "1_000"), ("max-num-seqs", "\u0663"),
])
def test_a_number_vllm_s_parser_reads_is_not_refused(name: str, value: str) -> None:
    from tests.shell.test_init import known
    for vllm in ({"args": {name: value}}, {"extra_args": [f"--{name}", value]}):
        config = from_dict({"vllm": {"model": "/m", **vllm}})
        assert vllmflags.validate_args(config, known()) == [], vllm


@pytest.mark.parametrize(("name", "value", "says"), [
    ("max-num-seqs", "0x10", "read by int()"),
    ("max-model-len", "1.5K", "no decimal before K"),
    ("max-num-seqs", "1e3", "read by int()"),
    ("max-num-seqs", ".9", "read by int()"), ("gpu-memory-utilization", "1e3k", "by float()"),
])
def test_a_number_vllm_s_parser_refuses_is_refused(name: str, value: str, says: str) -> None:
    from tests.shell.test_init import known
    problem = vllmflags.flag_problem(name, value, f"vllm.args.{name}", known())
    assert problem is not None and says in problem.problem, problem


@pytest.mark.parametrize(("args", "extra", "says"), [
    # [vllm.args] writes a list as one JSON word: int("[1,2,4]") stopped vLLM at each launch
    ({"cudagraph-capture-sizes": [1, 2, 4]}, [], '["--cudagraph-capture-sizes", "1", "2"'),
    ({"numa-bind-nodes": [0, 1]}, [], "vllm.extra_args"),
    ({"max-model-len": [8192, 4096]}, [], "takes one value"),
    ({"tokenizer": ["/a", "/b"]}, [], "takes one value"),
    # a flag of one value followed by more words: vLLM's `unrecognized arguments`
    ({}, ["--max-model-len", "8192", "4096"], "follow a flag that takes one value"),
    ({}, ["--tokenizer=/a", "/b"], "follow a flag that takes one value"),
])
def test_a_list_reaches_vllm_only_as_words_of_a_flag_that_takes_several(
        args: dict[str, object], extra: list[str], says: str) -> None:
    from tests.shell.test_init import known
    config = from_dict({"vllm": {"model": "/m", "args": args, "extra_args": extra}})
    problems = vllmflags.validate_args(config, known())
    assert len(problems) == 1 and says in problems[0].problem, problems


@pytest.mark.parametrize(("args", "extra"), [
    ({}, ["--cudagraph-capture-sizes", "1", "2", "4"]), ({}, ["--max-model-len", "-1"]),
    ({"allowed-origins": ["https://a", "https://b"]}, []),  # a JSON flag: JSON is right
    ({}, ["--numa-bind-nodes", "0", "1", "--max-model-len", "8192"]),
])
def test_words_of_a_flag_that_takes_several_pass(args: dict[str, object],
                                                 extra: list[str]) -> None:
    from tests.shell.test_init import known
    config = from_dict({"vllm": {"model": "/m", "args": args, "extra_args": extra}})
    assert vllmflags.validate_args(config, known()) == []


def test_init_writes_a_flag_of_several_numbers_as_words_vllm_reads() -> None:
    """init took one number and called the others stray words (nothing written); the
    launch now carries `--cudagraph-capture-sizes 1 2 4` and the config loads."""
    from tests.shell.test_init import init, known
    vllm, _, draft = init("vllm serve /m --cudagraph-capture-sizes 1 2 4 --max-model-len 2048")
    assert vllm["extra_args"] == ["--cudagraph-capture-sizes", "1", "2", "4"] and \
        vllm["args"] == {"max-model-len": 2048} and draft.errors == []
    config = from_dict({"vllm": vllm})
    assert vllmflags.validate_args(config, known()) == []


def test_a_flag_list_cached_before_lists_were_asked_reads_as_unknown(tmp_path: Path) -> None:
    """An older vllmwatch's cache has no "lists": which flags take several words is
    unknown (words after a flag are not judged), and a list for a number flag is still
    refused, as it is written as one JSON word."""
    path = tmp_path / "flags.json"
    path.write_text(json.dumps({"version": "0.99.0", "flags": ["max-model-len"],
                                "switches": [], "kinds": {"max-model-len": "number"}}))
    path.chmod(0o600)
    got = vllmflags._read(str(path), "0.99.0")
    assert got is not None and got.lists is None
    assert vllmflags.flag_problem("max-model-len", [1, 2], "k", got) is not None  # (JSON word)


@pytest.mark.parametrize("args,extra", [({"help": True}, []), ({}, ["--help"]),
                                        ({"version": True}, [])])
def test_a_flag_that_makes_vllm_exit_without_serving_is_refused(
        args: dict[str, object], extra: list[str]) -> None:
    """`help = true`: vLLM printed its help and exited 0 at every launch (an engine that
    "dies with exit code 0")."""
    assert any("exit 0 without serving" in p.problem for p in flags.args_problems(args, extra))


@pytest.mark.parametrize(("args", "extra", "says"), [
    # set twice: vLLM reads -tp as --tensor-parallel-size and takes the last
    ({"tensor-parallel-size": 1}, ["-tp", "2"], "--tensor-parallel-size is set by"),
    ({"tensor-parallel-size": 1}, ["-tp=2"], "--tensor-parallel-size is set by"),
    ({"optimization-level": 2}, ["-O3"], "--optimization-level is set by"),
    # the kind checks: a number flag's word, a JSON flag's JSON
    ({}, ["-tp", "two"], "is not one"),
    ({}, ["-cc", "{level: 3"], "bad JSON"),
    ({}, ["-tp=two"], "is not one"),
    ({}, ["-tp", "[1,2]"], "is not one"),
])
def test_a_short_flag_is_judged_as_its_long_form(args: dict[str, object], extra: list[str],
                                                 says: str) -> None:
    """`-tp 2` in extra_args skipped the kind and set-twice checks that
    `--tensor-parallel-size 2` gets: vLLM then ran with the other size (the spare's plan and
    check read the table's), or stopped at a word it cannot read."""
    from tests.shell.test_init import known
    config = from_dict({"vllm": {"model": "/m", "args": args, "extra_args": extra}})
    # what the launch refuses: the built-in rules and this vLLM's flag list (also check's
    # and the reload's)
    problems = [*flags.args_problems(args, extra), *vllmflags.validate_args(config, known())]
    assert any(says in p.problem for p in problems), problems


def test_a_short_flag_counts_where_its_long_form_does() -> None:
    """The readers: TP from `-tp 2` turns the spare's `auto` off (TP x PP = 1) and the
    engine's start method to vLLM's own, as `--tensor-parallel-size 2` does."""
    from vllmwatch.config.launch import parallel_sizes

    assert flags.table({}, ["-tp", "2", "-O3"]) == {"tensor-parallel-size": "2",
                                                    "optimization-level": "3"}
    assert parallel_sizes({}, ["-tp=2", "-pp", "2"])["tp"] == 2
    assert flags.long_forms(["-tp", "2", "-O", "3", "-h", "--x", "-1"]) == [
        "--tensor-parallel-size", "2", "--optimization-level", "3", "-h", "--x", "-1"]


@pytest.mark.parametrize(("args", "extra"), [
    ({"uds": "/run/v.sock"}, []), ({}, ["--uds", "/run/v.sock"]), ({}, ["--uds=/run/v.sock"]),
    ({"ssl-keyfile": "/k.pem", "ssl-certfile": "/c.pem"}, []),
    ({}, ["--ssl-certfile", "/c.pem"]), ({"headless": True}, []),
])
def test_a_flag_that_takes_vllm_off_the_probes_address_is_refused(
        args: dict[str, object], extra: list[str]) -> None:
    """`--uds` in extra_args was accepted: vLLM listened on the socket only, no probe
    reached it, and every launch timed out before READY (a crash loop)."""
    problems = flags.args_problems(args, extra)
    assert problems and all("never be READY" in p.problem for p in problems), problems
    assert flags.args_problems({"ssl-keyfile": False}, []) == []
