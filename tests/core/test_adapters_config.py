"""[[adapters]] and [lora] (issue 38 point 1): validation with the house's errors, the launch
flags (rank rounded up to one vLLM accepts), the operator's own LoRA flags refused."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.tinylora import make
from vllmwatch.config import adapters
from vllmwatch.config.command import build
from vllmwatch.config.schema import ConfigError, from_dict, load


def cfg(adapter_list: list[dict[str, Any]], lora: dict[str, Any] | None = None,
        **vllm: Any) -> Any:
    data: dict[str, Any] = {"vllm": {"model": "/m", "served_model_name": "base", **vllm},
                            "adapters": adapter_list}
    if lora is not None:
        data["lora"] = lora
    return from_dict(data)


def refused(adapter_list: Any, lora: dict[str, Any] | None = None, **vllm: Any
            ) -> dict[str, str]:
    with pytest.raises(ConfigError) as err:
        cfg(adapter_list, lora, **vllm)
    return {p.key: p.problem for p in err.value.problems}


def adapter_dir(tmp: Path, name: str, r: int = 8, **extra: Any) -> str:
    path = make(tmp / name, rank=r)
    if extra:
        data = json.loads((path / "adapter_config.json").read_text())
        (path / "adapter_config.json").write_text(json.dumps({**data, **extra}))
    return str(path)


def test_adapters_launch_with_their_flags_and_the_rank_rounded_up(tmp_path: Path) -> None:
    a, b = adapter_dir(tmp_path, "a", r=8), adapter_dir(tmp_path, "b", r=12)
    c = cfg([{"name": "sql", "path": a}, {"name": "org/chat", "path": b, "required": False}])
    assert [(x.name, x.rank, x.required) for x in c.adapters] == [
        ("sql", 8, True), ("org/chat", 12, False)]
    argv = build(c, {}).argv
    i = argv.index("--enable-lora")
    assert argv[i:] == ("--enable-lora", "--max-loras", "2", "--max-lora-rank", "16",
                        "--lora-modules", f"sql={a}", f"org/chat={b}")
    p = adapters.plan(c)
    assert (p.largest_r, p.max_lora_rank, p.rounded) == (12, 16, True)
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in build(c, {}).env


@pytest.mark.parametrize("folder", ["x,y", "sql_lr=2e-4", "a=b,c"])
def test_lora_overrides_live_and_the_json_form_for_a_comma(tmp_path: Path, folder: str) -> None:
    """A path with a comma, or an "=" (some vLLM versions split name=path at every "=":
    `sql=/srv/sql_lr=2e-4` ended every start in a ValueError), goes in vLLM's JSON form."""
    a = adapter_dir(tmp_path, folder, r=8)
    c = cfg([{"name": "one", "path": a}], {"live": True, "max_loras": 4, "max_lora_rank": 64})
    cmd = build(c, {})
    argv = cmd.argv
    assert argv[argv.index("--max-loras") + 1] == "4"
    assert argv[argv.index("--max-lora-rank") + 1] == "64"
    assert json.loads(argv[argv.index("--lora-modules") + 1]) == {"name": "one", "path": a}
    assert cmd.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_rank_pattern_counts_and_every_accepted_rank_rounds(tmp_path: Path) -> None:
    a = adapter_dir(tmp_path, "p", r=8, rank_pattern={"q_proj": 100})
    assert cfg([{"name": "p", "path": a}]).adapters[0].rank == 100
    assert [adapters.round_rank(r) for r in (1, 2, 8, 9, 300, 320, 321, 512, 513)] == [
        1, 8, 8, 16, 320, 320, 512, 512, None]


@pytest.mark.parametrize(("extra", "named"), [
    ({"rank_pattern": {"q_proj": "16"}}, '"rank_pattern"["q_proj"] must be a whole number '
                                         ">= 1, got '16'"),
    ({"rank_pattern": {"q_proj": 8, "v_proj": 0}}, '"rank_pattern"["v_proj"]'),
    ({"rank_pattern": [1, 2]}, '"rank_pattern" must be an object'),
    ({"r": True}, '"r" must be a whole number >= 1, got true'),
    ({"r": 8.5}, '"r" must be a whole number >= 1, got 8.5'),
])
def test_a_bad_rank_is_named_by_its_key_and_value(tmp_path: Path, extra: dict[str, Any],
                                                  named: str) -> None:
    """The error quoted the valid `r` when the bad value was in rank_pattern, and a
    rank_pattern that is a list was taken silently. Review of 2026-12-05."""
    a = adapter_dir(tmp_path, "p", r=8)
    conf = Path(a) / "adapter_config.json"
    conf.write_text(json.dumps({**json.loads(conf.read_text()), **extra}))
    with pytest.raises(ConfigError) as got:
        cfg([{"name": "p", "path": a}])
    assert named in str(got.value) and "adapter_config.json" in str(got.value), got.value


def test_a_null_rank_pattern_is_no_pattern(tmp_path: Path) -> None:
    a = adapter_dir(tmp_path, "p", r=8, rank_pattern=None)
    assert cfg([{"name": "p", "path": a}]).adapters[0].rank == 8


def test_no_adapters_no_lora_flags() -> None:
    argv = build(from_dict({"vllm": {"model": "/m"}, "lora": {"live": True}}), {}).argv
    assert not [a for a in argv if "lora" in a]


def test_bad_entries_name_file_key_value_and_what_is_accepted(tmp_path: Path) -> None:
    good = adapter_dir(tmp_path, "good")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notjson").mkdir()
    (tmp_path / "notjson" / "adapter_config.json").write_text("{r: 8")
    norank = adapter_dir(tmp_path, "norank", r=8, r_=1)
    data = json.loads(Path(norank, "adapter_config.json").read_text())
    del data["r"]
    Path(norank, "adapter_config.json").write_text(json.dumps(data))
    problems = refused([
        {"name": "has space", "path": good},
        {"name": "base", "path": good},
        {"name": "ok", "path": "relative/dir"},
        {"name": "ok2", "path": str(tmp_path / "empty")},
        {"name": "ok3", "path": str(tmp_path / "notjson")},
        {"name": "ok4", "path": norank},
        {"name": "ok5", "path": good, "required": "yes", "rank": 8},
        {"name": "dup", "path": good},
        {"name": "dup", "path": good},
    ])
    assert "has space" in problems["adapters[1].name"] and "no spaces" in \
        problems["adapters[1].name"]
    assert "base model" in problems["adapters[2].name"]
    assert "absolute path" in problems["adapters[3].path"]
    assert "adapter_config.json" in problems["adapters[4].path"] and "not found" in \
        problems["adapters[4].path"]
    assert "not JSON" in problems["adapters[5].path"]
    assert '"r"' in problems["adapters[6].path"]
    assert "true or false" in problems["adapters[7].required"]
    assert "unknown key" in problems["adapters[7].rank"]
    assert "unique" in problems["adapters[9].name"]


def test_not_an_array_too_many_and_ranks_beyond_vllm(tmp_path: Path) -> None:
    assert "array of tables" in refused({"name": "x"})["adapters"]
    good = adapter_dir(tmp_path, "g")
    many = [{"name": f"a{i}", "path": good} for i in range(adapters.MAX_ADAPTERS + 1)]
    assert "at most 64" in refused(many)["adapters"]
    huge = adapter_dir(tmp_path, "huge", r=1024)
    assert "up to 512" in refused([{"name": "h", "path": huge}])["adapters[1].path"]
    wide = adapter_dir(tmp_path, "wide", r=32)
    p = refused([{"name": "w", "path": wide}], {"max_lora_rank": 16})
    assert "rank 32, above 16" in p["lora.max_lora_rank"]
    p = refused([{"name": "w", "path": wide}], {"max_lora_rank": 33})
    assert "1, 8, 16, 32, 64, 128, 256, 320, 512" in p["lora.max_lora_rank"]
    assert "ceiling" in refused([], {"max_loras": 65})["lora.max_loras"]


def test_the_adapter_config_is_read_with_a_byte_cap(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.mkdir()
    (big / "adapter_config.json").write_text('{"r": 8, "pad": "' + "x" * 70000 + '"}')
    assert "big" in refused([{"name": "b", "path": str(big)}])["adapters[1].path"]
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "adapter_config.json")
    assert "FIFO" in refused([{"name": "f", "path": str(fifo)}])["adapters[1].path"]


@pytest.mark.parametrize("where", ["args", "extra"])
def test_operator_lora_flags_are_refused_when_adapters_are_managed(tmp_path: Path,
                                                                   where: str) -> None:
    good = adapter_dir(tmp_path, "g")
    if where == "args":
        p = refused([{"name": "g", "path": good}], args={"max-lora-rank": 64,
                                                         "lora_modules": "x=/y"})
        assert "lora.max_lora_rank" in p["vllm.args.max-lora-rank"]
        assert "[[adapters]]" in p["vllm.args.lora_modules"]
    else:
        p = refused([{"name": "g", "path": good}], extra_args=["--max-loras=3"])
        assert "lora.max_loras" in p["vllm.extra_args[0]"]
    # --enable-lora means the same: accepted; without [[adapters]] the flags are the operator's
    c = cfg([{"name": "g", "path": good}], args={"enable-lora": True})
    assert c.adapters
    plain = from_dict({"vllm": {"model": "/m", "args": {"lora-modules": "x=/y"}}})
    assert "x=/y" in build(plain, {}).argv


def test_a_file_error_names_the_line_of_the_adapter(tmp_path: Path) -> None:
    good = adapter_dir(tmp_path, "g")
    path = tmp_path / "vllmwatch.toml"
    path.write_text(f'[vllm]\nmodel = "/m"\n\n[[adapters]]\nname = "a"\npath = "{good}"\n\n'
                    '[[adapters]]\nname = "b"\npath = "/nope"\n\n[lora]\nlive = true\n')
    with pytest.raises(ConfigError) as err:
        load(str(path))
    assert err.value.problems[0].line == 10 and err.value.key == "adapters[2].path"
    assert str(err.value).startswith(f"{path}:10: adapters[2].path: ")
    with pytest.raises(ConfigError) as err:
        from_dict({"vllm": {"model": "/m"}, "adapter": []})
    assert "did you mean adapters?" in str(err.value)


def test_the_runtime_variable_is_lora_lives_alone(tmp_path: Path) -> None:
    """VLLM_ALLOW_RUNTIME_LORA_UPDATING set by the operator won over lora.live: with it off,
    vLLM had no unload endpoint, and its 404 was logged as an unload while vLLM still
    served the adapter. Refused in [vllm.env] at load and in vllm.env_file at the launch."""
    good = adapter_dir(tmp_path, "g")
    p = refused([{"name": "g", "path": good}], {"live": True},
                env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "false"})
    assert "lora.live" in p["vllm.env.VLLM_ALLOW_RUNTIME_LORA_UPDATING"]
    env = tmp_path / "vllm.env"
    env.write_text("VLLM_ALLOW_RUNTIME_LORA_UPDATING=false\n")
    env.chmod(0o600)
    c = cfg([{"name": "g", "path": good}], {"live": True}, env_file=str(env))
    with pytest.raises(ConfigError, match=r"vllm\.env_file: VLLM_ALLOW_RUNTIME_LORA_UPDATING"):
        build(c, {})


@pytest.mark.parametrize("missing", ["name", "path"])
def test_a_missing_key_is_said_missing(tmp_path: Path, missing: str) -> None:
    """A [[adapters]] entry without its path read `bad value None`."""
    entry = {"name": "sql", "path": adapter_dir(tmp_path, "a")}
    del entry[missing]
    with pytest.raises(ConfigError) as got:
        cfg([entry])
    assert f"adapters[1].{missing}: missing; expected" in str(got.value), got.value
    assert "None" not in str(got.value)


def test_adapters_on_a_hung_mount_cost_one_read_timeout_in_all(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each adapter_config.json was read after the one before: N adapters on one hung
    network mount took N x READ_TIMEOUT (24 of them, systemd's TimeoutStartSec=120 killed
    the start before the config error was said). They are read at once now."""
    from vllmwatch.config import safefile

    hung, real = threading.Event(), safefile.read_bounded

    def read(path: str, *args: Any, **kwargs: Any) -> bytes:
        if "/hung/" in path:  # a read blocked in the kernel, as on a dead NFS server
            hung.wait(30)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(safefile, "read_bounded", read)
    monkeypatch.setattr(adapters, "READ_TIMEOUT", 0.5)
    good = adapter_dir(tmp_path, "g")
    n = 16
    entries = [{"name": f"a{i}", "path": f"/hung/a{i}"} for i in range(n)]
    began = time.monotonic()
    try:
        p = refused([*entries, {"name": "g", "path": good}])
    finally:
        hung.set()
    took = time.monotonic() - began
    # one after the other: n x 0.5 s = 8 s at least; at once, 0.5 s and the threads' start
    assert took < n * adapters.READ_TIMEOUT / 2, took
    assert set(p) == {f"adapters[{i}].path" for i in range(1, n + 1)}
    assert "'/hung/a3/adapter_config.json': the read did not answer within 0.5s" in \
        p["adapters[4].path"]
