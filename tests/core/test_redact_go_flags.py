"""A Go program's help (`flag.PrintDefaults`) names each flag's type after it: `-token string`,
`-cookie-jar file`, then the usage on the next line. The one-dash flag rule read the type as
the flag's value and hid it, so a help text lost what it says; a type word before the line's
end or a column's spaces now stays, and any other word after a one-dash secret flag, a value
with a credential's shape above all, is hidden as before."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.secrets import values
from vllmwatch.config.redact import REDACTED, Redactor

R = Redactor(known=False)


@pytest.mark.parametrize("text", [
    "Usage of tool:\n  -token string\n    \tthe API token\n  -v\tverbose",
    "  -cookie-jar file\n    \twhere cookies go",
    "  -password-file path\n", "-api-key string  the key", "-token duration\n",
    '{"msg": "  -token string\\n    \\tthe token"}',
])
def test_a_go_flags_type_word_stays(text: str) -> None:
    assert R.text(text) == text


@settings(max_examples=200, deadline=None)
@given(value=values, name=st.sampled_from(("-token", "-api-key", "-password", "-cookie")),
       post=st.sampled_from(("\n", "", "  x", " -port 1")))
def test_a_value_after_a_one_dash_secret_flag_is_still_hidden(
        value: str, name: str, post: str) -> None:
    out = R.text(f"run {name} {value}{post}")
    assert value not in out and REDACTED in out, out
