"""`vllmwatch init` proposes the [[smoke]] checks that fit the line's flags (issue 38.2): the
file it writes loads, and its checks are the ones the flags call for."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllmwatch.config import serveline, vllmflags
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.migrate import render, translate
from vllmwatch.migrate.draft import Facts

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FIXTURES = Path(__file__).resolve().parent.parent / "shell" / "fixtures"


def _known() -> vllmflags.FlagSet:
    data = json.loads((FIXTURES / "vllm-0.32.0-flags.json").read_text())
    return vllmflags.FlagSet(data["version"], frozenset(data["flags"]),
                             frozenset(data["switches"]), data["kinds"], data["aliases"],
                             frozenset(data["lists"]))


def _init(text: str) -> tuple[Config, str]:
    line = serveline.parse(serveline.split_text(text))
    toml = render.render(translate.translate(line, Facts(known=_known())), "test")
    return from_dict(tomllib.loads(toml)), toml


def test_the_guides_whole_line_gets_a_chat_check_for_its_chat_template() -> None:
    config, toml = _init((FIXTURES / "guide-qwen35-9b.txt").read_text())
    assert [(c.name, c.endpoint, c.required) for c in config.smoke] == [
        ("chat", "chat", True)]
    assert "# --chat-template: READY waits" in toml
    assert '# [[smoke]]\n# endpoint = "messages"' in toml  # proposed, left to the operator


@pytest.mark.parametrize(("line", "endpoints"), [
    ("vllm serve /m --enable-auto-tool-choice --tool-call-parser hermes", ["tools"]),
    ("vllm serve /m --enable-auto-tool-choice --tool-call-parser hermes --chat-template "
     "/t.jinja", ["tools", "chat"]),
    ("vllm serve /m --runner pooling", ["embeddings"]),
    ("vllm serve /m --convert embed", ["embeddings"]),
    ("vllm serve /m", []),
])
def test_flags_to_checks(line: str, endpoints: list[str]) -> None:
    config, toml = _init(line)
    assert [c.endpoint for c in config.smoke] == endpoints
    assert ("# endpoint = \"messages\"" in toml) == ("embeddings" not in endpoints)
    tools = [c for c in config.smoke if c.endpoint == "tools"]
    assert all(c.expect == "tool_calls" for c in tools)
