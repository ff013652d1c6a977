"""Config parsing: valid files, every class of bad input, units."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllmwatch.config import units
from vllmwatch.config.schema import ConfigError, config_path, from_dict, load
from vllmwatch.core import exitcodes

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "vllmwatch.toml"
    path.write_text(text)
    return str(path)


def test_shipped_example_loads_with_its_documented_values() -> None:
    cfg = load(str(REPO / "etc" / "vllmwatch.toml"))
    assert cfg.vllm.model == "/srv/models/Qwen3.5-9B"
    assert cfg.vllm.args["max-model-len"] == 32768
    assert cfg.probe.canary_interval == 2.0  # issue 24: hangs seen within ~8 s
    assert cfg.restart.stop_timeout == 30.0
    assert cfg.memory.gpu_limit == 0.0
    assert len(cfg.sha256) == 64


def test_minimal_file_gets_defaults(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, '[vllm]\nmodel = "/m"\n'))
    assert cfg.vllm.command == ["vllm", "serve"]
    assert cfg.vllm.port == 8000
    assert cfg.vllm.gpus is None and cfg.vllm.uses_gpu
    assert cfg.vllm.model_name == "/m"
    assert cfg.status.listen == "127.0.0.1:9101"


def test_units_in_all_places(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, """
[vllm]
model = "/m"
gpus = []
[memory]
gpu_limit = "75000MiB"
host_limit = "70GiB"
gpu_growth_rate = "200MiB/h"
slope_window = "1h30m"
[probe]
timeout = "500ms"
interval = 2
"""))
    assert cfg.memory.gpu_limit == 75000
    assert cfg.memory.host_limit == 70 * 1024
    assert cfg.memory.gpu_growth_rate == 200
    assert cfg.memory.slope_window == 5400
    assert cfg.probe.timeout == 0.5 and cfg.probe.interval == 2.0
    assert not cfg.vllm.uses_gpu


@pytest.mark.parametrize(("text", "key", "words"), [
    ('[vllm]\nmodel = "/m"\nport = "eighty"\n', "vllm.port", ["'eighty'", "port number"]),
    ('[vllm]\nmodel = "/m"\nport = 70000\n', "vllm.port", ["70000", "1-65535"]),
    ('[vllm]\nmodel = "/m"\n[memory]\ngpu_limt = 5\n', "memory.gpu_limt",
     ["did you mean memory.gpu_limit"]),
    ('[vllm]\nmodel = "/m"\n[memroy]\n', "memroy", ["did you mean memory"]),
    ('[vllm]\nmodel = "/m"\n[probe]\ninterval = "5 parsecs"\n', "probe.interval",
     ["'5 parsecs'", '"30s"']),
    ('[vllm]\nmodel = "/m"\n[memory]\ngpu_limit = "lots"\n', "memory.gpu_limit",
     ["'lots'", "75000MiB"]),
    ('[vllm]\nmodel = "/m"\n[memory]\nhost_limit = "5XB"\n', "memory.host_limit", ["5XB"]),
    ('[vllm]\nmodel = "/m"\n[restart]\nkill_stale = "yes"\n', "restart.kill_stale",
     ["true or false"]),
    ('[vllm]\nmodel = "/m"\n[log]\nlevel = "loud"\n', "log.level", ["'loud'", "'debug'"]),
    ('[vllm]\nmodel = "/m"\ngpus = [0, 0]\n', "vllm.gpus", ["twice"]),
    ('[vllm]\nmodel = "/m"\ncommand = "vllm serve"\n', "vllm.command", ["an array of words"]),
    ('[vllm]\nmodel = "/m"\n[restart]\nquiet_hours = "2am-5am"\n', "restart.quiet_hours",
     ["HH:MM-HH:MM"]),
    ('[vllm]\nmodel = "/m"\n[vllm.args]\n"--max-model-len" = 5\n', "vllm.args",
     ["without dashes"]),
    ('[vllm]\nmodel = "/m"\n[vllm.env]\nVLLM_HTTP_TIMEOUT_KEEP_ALIVE = "2.5"\n',
     "vllm.env.VLLM_HTTP_TIMEOUT_KEEP_ALIVE", ["'2.5'", "whole number", '"5"']),
    ('[vllm]\nmodel = "/m"\n[vllm.env]\nVLLM_HTTP_TIMEOUT_KEEP_ALIVE = "5s"\n',
     "vllm.env.VLLM_HTTP_TIMEOUT_KEEP_ALIVE", ["'5s'", "whole number"]),
    ('[vllm]\nport = 8000\n', "vllm.model", ["missing"]),
    ('vllm = 5\n', "vllm", ["expected a table"]),
])
def test_bad_values_name_file_key_value_and_what_is_accepted(
        tmp_path: Path, text: str, key: str, words: list[str]) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert err.value.key == key
    message = str(err.value)
    assert path in message
    for word in words:
        assert word in message


def test_bad_key_errors_name_their_line(tmp_path: Path) -> None:
    path = write(tmp_path, '[vllm]\nmodel = "/m"\n\n[probe]\ninterval = 5\n'
                 '[memory]\nsample_interval = 1\ngpu_limit = "lots"\n')
    with pytest.raises(ConfigError) as err:
        load(path)
    assert err.value.line == 8
    assert str(err.value).startswith(f"{path}:8: memory.gpu_limit:")


def test_malformed_toml_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, '[vllm]\nmodel = "/m"\nport = \n')
    with pytest.raises(ConfigError) as err:
        load(path)
    assert "line 3" in str(err.value)
    assert "invalid TOML" in str(err.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found") as err:
        load(str(tmp_path / "nope.toml"))
    assert "pass --config PATH or set VLLMWATCH_CONFIG" in str(err.value)


@pytest.mark.parametrize(("errno_", "hint"), [
    (13, "the unit runs as the user vllmwatch, which must read it"),  # EACCES
    (2, "pass --config PATH"),  # (ENOENT, as open() said it, also under a race)
    (40, ""), (5, ""),  # ELOOP, EIO: neither hint is the way out
])
def test_a_file_that_cannot_be_opened_gets_the_hint_of_its_cause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errno_: int, hint: str) -> None:
    """The --config hint was said for every open failure, a file this user may not read too
    (root reads past the mode bits, so the refusal is made here, not by chmod)."""
    import os

    from vllmwatch.config import safefile

    path = tmp_path / "vllmwatch.toml"
    path.write_text("[vllm]\nmodel = 'm'\n")
    real = os.open

    def refuse(name: str | os.PathLike[str], *args: int, **kw: int) -> int:
        if str(name) == str(path):
            raise OSError(errno_, os.strerror(errno_))
        return real(name, *args, **kw)

    monkeypatch.setattr(safefile.os, "open", refuse)
    with pytest.raises(ConfigError) as err:
        load(str(path))
    said = str(err.value)
    assert (os.strerror(errno_) if errno_ != 2 else "file not found") in said, said
    assert (hint in said) if hint else ("(pass --config" not in said and "vllmwatch, which"
                                        not in said), said
    assert ("pass --config" in said) == (errno_ == 2), said


def test_config_path_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLMWATCH_CONFIG", "/env.toml")
    assert config_path("/cli.toml") == "/cli.toml"
    assert config_path(None) == "/env.toml"
    monkeypatch.delenv("VLLMWATCH_CONFIG")
    assert config_path(None) == "/etc/vllmwatch/vllmwatch.toml"


def test_defaults_are_not_shared_between_instances() -> None:
    a = from_dict({"vllm": {"model": "a"}})
    b = from_dict({"vllm": {"model": "b"}})
    a.vllm.env["X"] = "1"
    assert b.vllm.env == {}


@pytest.mark.parametrize(("text", "seconds"), [
    (30, 30.0), ("30s", 30.0), ("15m", 900.0), ("2h", 7200.0), ("1h30m", 5400.0),
    ("500ms", 0.5), ("1d", 86400.0), ("2.5", 2.5)])
def test_durations(text: object, seconds: float) -> None:
    assert units.parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "abc", "5 m s", "-3", True, [1], "1h foo",
                                 # a unit twice or out of order: "1h1h" read as 2 h
                                 "1h1h", "30m1h", "1s1s", "1m 2m", "5ms1s"])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError):
        units.parse_duration(bad)


_UNITS = [("d", 86400), ("h", 3600), ("m", 60), ("s", 1), ("ms", 0.001)]


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 999)), min_size=1, max_size=5))
def test_a_duration_reads_as_its_parts_only_with_each_unit_once_largest_first(
        parts: list[tuple[int, int]]) -> None:
    text = "".join(f"{n}{_UNITS[u][0]}" for u, n in parts)
    units_in_order = [u for u, _ in parts]
    if units_in_order == sorted(set(units_in_order)):
        assert units.parse_duration(text) == pytest.approx(
            sum(n * _UNITS[u][1] for u, n in parts))
    else:
        with pytest.raises(ValueError):
            units.parse_duration(text)


@pytest.mark.parametrize(("key", "value"), [
    ("gpus", [99999999999999999999]), ("gpus", 256), ("gpus", [0, 2**40]),
    ("command", ["", "serve"]), ("command", ["vllm", ""]), ("command", ["vllm", "  "]),
    ("command", []),
])
def test_values_vllm_or_nvml_cannot_take_are_refused_at_load(key: str, value: object) -> None:
    """A GPU index past NVML's unsigned int overflowed in the daemon; an empty program
    cannot be run, an empty word after it is a second MODEL to vLLM."""
    with pytest.raises(ConfigError, match=f"vllm.{key}"):
        from_dict({"vllm": {"model": "/m", key: value}})
    assert from_dict({"vllm": {"model": "/m", "gpus": [0, 255]}}).vllm.gpus == [0, 255]


@pytest.mark.parametrize(("text", "mib"), [
    (512, 512.0), ("75000MiB", 75000.0), ("70GiB", 71680.0), ("1TiB", 1048576.0),
    ("1GB", 1000**3 / 2**20), ("2048KiB", 2.0)])
def test_sizes(text: object, mib: float) -> None:
    assert units.parse_size_mib(text) == pytest.approx(mib)


def test_cli_config_error_is_one_line_and_the_config_exit_code(tmp_path: Path) -> None:
    path = write(tmp_path, '[vllm]\nmodel = "/m"\n[memory]\ngpu_limit = "huge"\n')
    out = subprocess.run([sys.executable, "-m", "vllmwatch", "print-command", "--config", path],
                         capture_output=True, text=True, check=False)
    assert out.returncode == exitcodes.CONFIG
    assert "Traceback" not in out.stderr
    assert "memory.gpu_limit" in out.stderr and "'huge'" in out.stderr
    assert out.stderr.count("\n") == 1


def test_cli_version() -> None:
    out = subprocess.run([sys.executable, "-m", "vllmwatch", "--version"], capture_output=True,
                         text=True, check=True)
    assert out.stdout.startswith("vllmwatch ")


@pytest.mark.parametrize("value", ["5", "600", "0", " 3 ", "-1"])
def test_vllm_keepalive_values_vllm_parses_are_taken(tmp_path: Path, value: str) -> None:
    cfg = load(write(tmp_path, f'[vllm]\nmodel = "/m"\n[vllm.env]\n'
                               f'VLLM_HTTP_TIMEOUT_KEEP_ALIVE = "{value}"\n'))
    assert cfg.vllm.env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == value


def test_a_refused_model_is_not_also_called_missing(tmp_path: Path) -> None:
    """model = "/m\\u0000" is refused for its NUL byte; the default it kept ("") then made
    the cross-checks add "vllm.model: missing", which the file's model is not."""
    path = write(tmp_path, '[vllm]\nmodel = "/m\\u0000"\n')
    with pytest.raises(ConfigError) as got:
        load(path)
    text = str(got.value)
    assert "NUL byte" in text and "missing" not in text


def test_a_config_saved_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    """Notepad's UTF-8 starts with a BOM: it was "invalid TOML: Invalid statement (at line 1,
    column 1)", naming nothing a person could see."""
    path = tmp_path / "v.toml"
    path.write_bytes(b"\xef\xbb\xbf" + b'[vllm]\nmodel = "/m"\n')
    assert load(str(path)).vllm.model == "/m"


def test_the_shipped_example_shows_every_key_of_every_section() -> None:
    """etc/vllmwatch.toml (the package's /etc/vllmwatch/vllmwatch.toml) says "Every key is
    shown with its default" and the README sends readers there for every key; probe.canary_path
    and probe.canary_body, the keys canary = "custom" needs, were in no line. Each key of each
    section has its line in its own section, set or (an example) commented out."""
    import dataclasses
    import re

    from vllmwatch.config.schema import SECTIONS

    text = (REPO / "etc" / "vllmwatch.toml").read_text()
    bodies = dict(re.findall(r"^\[([a-z.]+)\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M))
    missing = [f"{name}.{f.name}" for name, cls in SECTIONS.items()
               for f in dataclasses.fields(cls)
               if f.name not in ("args", "env") and not re.search(
                   rf"^(# )?{f.name} = ", bodies.get(name, ""), re.M)]
    assert missing == []
