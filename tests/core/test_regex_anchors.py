"""A pattern that decides whether a whole value is acceptable ends in \\Z, not "$": "$" also
matches before a final newline, so `re.match(r"^[a-z]+$", "key\\n")` accepts a value that is
not what the pattern says (hypothesis found a TOML key "0\\n" written bare, which cannot be
read back). Patterns ending in "\\s*$" accept trailing whitespace on purpose and pass."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllmwatch.config.serveline import _NUMBER
from vllmwatch.incident.store import _NAME
from vllmwatch.migrate.render import key
from vllmwatch.shell.standby import _PYTHON

PKG = Path(__file__).resolve().parents[2] / "vllmwatch"
ANCHORED = re.compile(r"""re\.(?:compile|match|fullmatch)\(\s*r?(["'])\^(.*?)\1""")


def test_no_whole_value_pattern_ends_in_a_bare_dollar() -> None:
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for match in ANCHORED.finditer(line):
                body = match.group(2)
                if body.endswith("$") and not body.endswith(r"\s*$"):
                    bad.append(f"{path.relative_to(PKG)}:{n}: {body}")
    assert not bad, f"end these in \\Z (or \\s*$ where whitespace is meant): {bad}"


@pytest.mark.parametrize(("pattern", "good"), [
    (_NUMBER, "-1.5e3"), (_NAME, "20261202T143000Z-hang"), (_PYTHON, "python3.12")])
def test_a_final_newline_is_not_part_of_an_accepted_value(pattern: re.Pattern[str],
                                                          good: str) -> None:
    assert pattern.match(good) and not pattern.match(good + "\n")


def test_a_key_with_a_final_newline_is_quoted() -> None:
    assert key("max-model-len") == "max-model-len" and key("0\n") != "0\n"
