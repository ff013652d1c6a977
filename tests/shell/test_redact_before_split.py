"""A child's output is redacted whole before it is split into lines: str.splitlines() also
splits at `\\r`, `\\v`, `\\f`, `\\x1c`-`\\x1e`, `\\x85`, `\\u2028`, `\\u2029`, so the last line of a
prewarm script's stderr (prewarm/kernels.py) or of py-spy's (incident/dumpers.py) could be a
secret's value alone, parted from its name, which no rule finds: it was shown in clear."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from vllmwatch.incident import dumpers
from vllmwatch.prewarm import kernels

SECRET = "Zq9sEcReT41x"
# str.splitlines() breaks that are not a line feed, after a name's separator or as one
_BREAKS = ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")
_LINES = [f"{form}{brk}{SECRET}" for brk in _BREAKS
          for form in ("HF_TOKEN", "api_key=", "--api-key", "password:")]


@pytest.mark.parametrize("line", _LINES)
def test_the_prewarm_scripts_last_line_is_cut_from_redacted_text(line: str) -> None:
    outcome = kernels._parse("", f"Traceback (most recent call last):\nboom\n{line}\n", 1)
    assert SECRET not in outcome.detail and "<redacted>" in outcome.detail, outcome.detail


def test_py_spys_error_line_is_cut_from_redacted_text(tmp_path: Path) -> None:
    # (not `\r`: the pipe's universal newlines make it a line feed before anything reads it)
    exe = tmp_path / "py-spy"
    text = "".join(f"{line}\n" for line in _LINES[4::4])
    exe.write_text(f"#!/bin/sh\nprintf '%s' '{text}' >&2\nexit 1\n", encoding="utf-8")
    exe.chmod(0o755)
    dump = dumpers.pyspy_dump(str(exe), 1, time.monotonic() + 10)
    assert not dump.ok and dump.error and SECRET not in dump.error, dump.error
    assert SECRET not in dump.raw
