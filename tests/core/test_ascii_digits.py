# ruff: noqa: RUF001, RUF002  (the characters under test are the point)
"""Digits are 0-9 where vllmwatch reads its own syntax, and what vLLM reads where the value is
vLLM's. Python's `\\d` and `str.isdigit()` also take other scripts' digits: '٣' (which int()
reads as 3) and '²' (which int() refuses). So a duration "٣٠s" was 30 s, a port "٨٠٠٠" 8000,
and `CUDA_VISIBLE_DEVICES=²` a traceback in `check` and in pre-warm."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.shell.test_init_migration import toml_of
from vllmwatch.check.fights import _shared_gpus
from vllmwatch.config.hosts import parse_listen
from vllmwatch.config.units import (
    parse_duration,
    parse_rate_mib_per_h,
    parse_size_mib,
    parse_window,
)
from vllmwatch.prewarm.backend import parse_version, requested

# Every character str.isdigit() takes that is not 0-9: decimal digits of other scripts and
# superscripts, circled and other "digit" characters int() refuses.
OTHER_DIGITS = st.sampled_from([c for c in map(chr, range(0x80, 0x110000)) if c.isdigit()])


def refused(parse: Callable[[str], object], text: str) -> bool:
    try:
        parse(text)
    except ValueError:
        return True
    return False


@given(OTHER_DIGITS, st.sampled_from(["{}", "{}0", "1{}", "{}s", "1{}m", "0.{}s", "1h{}m"]))
def test_a_duration_with_another_scripts_digit_is_refused(digit: str, shape: str) -> None:
    assert refused(parse_duration, shape.format(digit))


@given(OTHER_DIGITS, st.sampled_from(["{}", "{}GiB", "7{}000MiB", "1.{}g"]))
def test_a_size_or_rate_with_another_scripts_digit_is_refused(digit: str, shape: str) -> None:
    assert refused(parse_size_mib, shape.format(digit))
    assert refused(parse_rate_mib_per_h, shape.format(digit) + "/h")


@given(OTHER_DIGITS, st.sampled_from(["{}2:00-06:00", "02:{}0-06:00", "02:00-0{}:00"]))
def test_a_quiet_window_with_another_scripts_digit_is_refused(digit: str, shape: str) -> None:
    assert refused(parse_window, shape.format(digit))


@given(OTHER_DIGITS, st.sampled_from(["127.0.0.1:{}", "127.0.0.1:80{}0", "[::1]:{}"]))
def test_a_listen_port_with_another_scripts_digit_is_refused_saying_what_is_accepted(
        digit: str, shape: str) -> None:
    with pytest.raises(ValueError, match="is not a number from 1 to 65535"):
        parse_listen(shape.format(digit))


def test_ascii_forms_still_parse() -> None:
    assert parse_duration("1h30m") == 5400.0 and parse_duration("30") == 30.0
    assert parse_size_mib("70GiB") == 70 * 1024 and parse_rate_mib_per_h("1GiB/h") == 1024
    assert parse_window("02:00-06:00") == (120, 360)
    assert parse_listen("127.0.0.1:8000") == ("127.0.0.1", 8000)


@pytest.mark.parametrize(("theirs", "shared"), [
    ("²", "GPUs ² (by UUID: compare with nvidia-smi -L)"),  # int() refuses it: was a traceback
    ("١", "GPUs ١ (by UUID: compare with nvidia-smi -L)"),  # CUDA reads 0-9 only
    ("0,1", "GPU 0"),
])
def test_check_reads_another_process_gpus_without_a_traceback(theirs: str, shared: str) -> None:
    assert _shared_gpus([0], theirs) == shared


@pytest.mark.parametrize("value", ["²", "١", "٣,٤"])
def test_migrate_keeps_a_cuda_visible_devices_that_cuda_does_not_read_as_numbers(
        value: str) -> None:
    data, _ = toml_of(f"CUDA_VISIBLE_DEVICES={value} vllm serve m")
    assert "gpus" not in data["vllm"] and data["vllm"]["env"]["CUDA_VISIBLE_DEVICES"] == value


def test_migrate_reads_the_port_as_vllm_does() -> None:
    # vLLM's --port is argparse's int(): '٨٠٠٠' served on 8000; the config says 8000.
    data, _ = toml_of("vllm serve m --port ٨٠٠٠")
    assert data["vllm"]["port"] == 8000


def test_migrate_names_a_port_vllm_refuses_instead_of_a_traceback() -> None:
    from vllmwatch.config.schema import ConfigError
    with pytest.raises(ConfigError, match=r"vllm\.port: bad value '8²'"):
        toml_of("vllm serve m --port 8²")


@pytest.mark.parametrize(("value", "version"), [("²", None), ("٣", 3), ("3", 3), ("x", None)])
def test_prewarm_reads_flash_attn_version_as_vllm_does(value: str,
                                                       version: int | None) -> None:
    _, got = requested({"attention-config.flash_attn_version": value}, {}, (0, 26, 0))
    assert got == version
    _, got = requested({}, {"VLLM_FLASH_ATTN_VERSION": value}, (0, 14, 0))
    assert got == version


@pytest.mark.parametrize(("text", "version"), [("0.26.0", (0, 26, 0)), ("0.٢6.0", (0,)),
                                               ("1²", (1,))])
def test_a_version_reads_0_to_9_only(text: str, version: tuple[int, ...]) -> None:
    assert parse_version(text) == version
