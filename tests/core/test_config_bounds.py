"""Every number in the config is finite and in range; every problem is reported at once."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllmwatch.config.bounds import bounds_of
from vllmwatch.config.schema import SECTIONS, ConfigError, from_dict, load

NUMERIC = [(section, f.name, f.metadata["kind"], bounds_of(f.metadata["kind"], f.metadata))
           for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)
           if bounds_of(f.metadata["kind"], f.metadata) is not None]
KEYS = [f"{section}.{name}" for section, name, _, _ in NUMERIC]


def config_with(section: str, name: str, value: object) -> dict[str, dict[str, object]]:
    data: dict[str, dict[str, object]] = {"vllm": {"model": "/m"}}
    data.setdefault(section, {})[name] = value
    if (section, name) == ("restart", "backoff_initial"):
        data["restart"]["backoff_max"] = "1d"  # keep the cross-check out of the way
    return data


def test_every_numeric_key_has_bounds() -> None:
    assert len(NUMERIC) >= 30
    assert "restart.stop_timeout" in KEYS and "memory.host_limit" in KEYS


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(NUMERIC), st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, -1.0, 1e-9, 0.05, 1e300, float("nan"), float("inf"),
                     -float("inf")]),
    st.integers(min_value=-10**20, max_value=10**20)))
def test_any_number_is_refused_by_name_or_finite_within_bounds(
        field: tuple[str, str, str, object], value: float) -> None:
    section, name, _, bounds = field
    assert bounds is not None
    try:
        config = from_dict(config_with(section, name, value))
    except ConfigError as exc:
        assert any(p.key == f"{section}.{name}" for p in exc.problems), str(exc)
        return
    got = getattr(getattr(config, section), name)
    assert math.isfinite(got)
    assert (got == 0 and bounds.zero is not None) or bounds.low <= got <= bounds.high  # type: ignore[attr-defined]


@pytest.mark.parametrize("text", ['"nans"', '"infs"', '"1e999s"', '"9' * 1 + "9" * 400 + 's"'])
def test_duration_strings_that_overflow_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match=r"probe\.interval"):
        from_dict({"vllm": {"model": "/m"}, "probe": {"interval": text.strip('"')}})


@pytest.mark.parametrize(("key", "value"), [
    ("restart.stop_timeout", float("inf")), ("startup.timeout", 0), ("probe.interval", math.nan),
    ("probe.interval", 0.01), ("memory.host_limit", math.nan), ("probe.canary_interval", 0),
    ("memory.sample_interval", "0s"), ("restart.backoff_multiplier", math.inf),
    ("restart.backoff_jitter", 1.5), ("prewarm.page_cache_max_fraction", math.nan),
    ("memory.gpu_growth_rate", "-5MiB/h"), ("probe.stall_timeout", 0),
])
def test_issue_repros_are_refused_naming_the_key(key: str, value: object) -> None:
    section, name = key.split(".")
    with pytest.raises(ConfigError) as err:
        from_dict(config_with(section, name, value))
    assert err.value.key == key and "accepted" in str(err.value)


@pytest.mark.parametrize(("key", "value"), [
    ("restart.drain_timeout", 0), ("restart.gpu_release_timeout", "0s"),
    ("memory.gpu_limit", 0), ("memory.baseline_delay", 0), ("restart.backoff_jitter", 0),
    ("restart.gpu_release_tolerance", 0), ("prewarm.page_cache_max_fraction", 0),
])
def test_zero_is_accepted_where_it_is_documented_to_mean_off(key: str, value: object) -> None:
    section, name = key.split(".")
    assert getattr(getattr(from_dict(config_with(section, name, value)), section), name) == 0


def test_every_range_and_zero_meaning_is_documented_in_the_shipped_example() -> None:
    text = (Path(__file__).resolve().parents[2] / "etc" / "vllmwatch.toml").read_text()
    sections = text.split("\n[")
    for section, name, _, bounds in NUMERIC:
        body = next(b for b in sections if b.startswith(f"{section}]"))
        line = next(x for x in body.splitlines() if x.startswith(f"{name} = "))
        assert line.endswith(f"# {bounds.describe()}"), line  # type: ignore[attr-defined]


def test_all_problems_of_a_file_in_one_error_each_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[vllm]\nmodel = "/m"\n[vllm.args]\nrope-scaling = { type = "yarn" }\n'
                    'device = "cpu"\ndisable-log-requests = true\n'
                    '[probe]\ninterval = nan\ntimeout = 0\n[restart]\nstop_timeout = inf\n'
                    '[startup]\ntimeout = 0\n[status]\nlisten = "localhost"\n')
    with pytest.raises(ConfigError) as err:
        load(str(path))
    keys = {p.key: p.line for p in err.value.problems}
    assert keys == {"probe.interval": 8, "probe.timeout": 9, "restart.stop_timeout": 11,
                    "startup.timeout": 13, "status.listen": 15, "vllm.args.rope-scaling": 4,
                    "vllm.args.device": 5, "vllm.args.disable-log-requests": 6}
    text = str(err.value)
    assert text.startswith(f"{path}: 8 problems:")
    assert f"{path}:11: restart.stop_timeout: bad value inf" in text


@pytest.mark.parametrize(("listen", "allow_remote", "words"), [
    ("127.0.0.1", False, ["no port"]),
    ("localhost:70000", False, ["65535"]),
    ("127.0.0.1:0", False, ["port 0"]),
    ("::1:9101", False, ["brackets"]),
    ("[::1:9101", False, ["HOST:PORT"]),
    ("0.0.0.0:9101", False, ["loopback", "allow_remote"]),
    (":9101", False, ["all interfaces", "allow_remote"]),
    ("[::]:9101", False, ["loopback"]),
    ("bad host!:9101", False, ["neither an IP address nor a host name"]),
])
def test_status_listen_is_validated_at_load(listen: str, allow_remote: bool,
                                            words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict({"vllm": {"model": "/m"},
                   "status": {"listen": listen, "allow_remote": allow_remote}})
    assert err.value.key == "status.listen"
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("listen", ["", "127.0.0.1:9101", "[::1]:9101", "localhost:9101",
                                    "status.example.com:9101"])
def test_good_status_listen_values_load(listen: str) -> None:
    assert from_dict({"vllm": {"model": "/m"}, "status": {"listen": listen}}).status.listen \
        == listen


def test_remote_listen_accepted_with_allow_remote() -> None:
    c = from_dict({"vllm": {"model": "/m"}, "status": {"listen": "0.0.0.0:9101",
                                                        "allow_remote": True}})
    assert c.status.allow_remote


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(NUMERIC), st.floats(allow_nan=True, allow_infinity=True)
       | st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_the_same_through_a_toml_file(tmp_path_factory: pytest.TempPathFactory,
                                      field: tuple[str, str, str, object],
                                      value: float) -> None:
    section, name, _, bounds = field
    text = repr(value).replace("+", "")  # TOML: 1e300, nan, inf, -inf
    extra = 'backoff_max = "1d"\n' if (section, name) == ("restart", "backoff_initial") else ""
    path = tmp_path_factory.mktemp("c") / "c.toml"
    header = "" if section == "vllm" else f"[{section}]\n"
    path.write_text(f'[vllm]\nmodel = "/m"\n{header}{name} = {text}\n{extra}')
    try:
        config = load(str(path))
    except ConfigError as exc:
        assert [p.key for p in exc.problems] == [f"{section}.{name}"], str(exc)
        assert exc.problems[0].line == (3 if section == "vllm" else 4)
        return
    got = getattr(getattr(config, section), name)
    assert math.isfinite(got)
    assert (got == 0 and bounds.zero is not None) or bounds.low <= got <= bounds.high  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789abcdef.:[]- x", max_size=24), st.booleans())
def test_any_status_listen_is_refused_by_name_or_usable(listen: str, allow_remote: bool) -> None:
    from vllmwatch.config.hosts import parse_listen

    try:
        config = from_dict({"vllm": {"model": "/m"},
                            "status": {"listen": listen, "allow_remote": allow_remote}})
    except ConfigError as exc:
        assert [p.key for p in exc.problems] == ["status.listen"], str(exc)
        return
    parsed = parse_listen(config.status.listen)
    assert parsed is None or 1 <= parsed[1] <= 65535
