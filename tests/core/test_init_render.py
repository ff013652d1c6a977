"""`vllmwatch init` writes TOML that reads back as the values it meant, whatever a guide's
flag values hold (quotes, newlines, control characters, unicode, JSON tables), and comments
that never break the file."""

from __future__ import annotations

import sys

from hypothesis import given
from hypothesis import strategies as st

from vllmwatch.migrate import render
from vllmwatch.migrate.draft import Draft, Entry

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TEXT = st.text(st.characters(blacklist_categories=("Cs",)))
SCALAR = st.one_of(TEXT, st.booleans(), st.integers(-2**63, 2**63 - 1),
                   st.floats(allow_nan=False, allow_infinity=False))
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)), max_leaves=10)


@given(TEXT, VALUE, TEXT)
def test_a_line_reads_back_as_written(name: str, value: object, note: str) -> None:
    draft = Draft(args=[Entry(name or "x", value, note)])
    text = render.render(draft, note)
    assert tomllib.loads(text)["vllm"]["args"] == {name or "x": value}


@given(TEXT, VALUE, TEXT)
def test_a_commented_out_line_stays_a_comment(name: str, value: object, note: str) -> None:
    draft = Draft(args=[Entry(name or "x", value, note, active=False)])
    assert tomllib.loads(render.render(draft, note))["vllm"]["args"] == {}
