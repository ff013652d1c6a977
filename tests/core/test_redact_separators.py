"""Any space or control character between a secret name and its value separates them, raw or
as an escape sequence writes it (config/secretvalues.py's CONTROL and ESCAPED): `HF_TOKEN\\rK`
(a terminal shows K alone on its line), `HF_TOKEN\\x0bK`, `--api-key\\\\fK`, `"api_key":\\\\n
"K"` (a YAML key quoted, JSON-encoded) showed K; only a space, a tab and the escapes `\\n`
`\\r` `\\t` separated. After a bare `NAME` a line break still ends the name's line (no value)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.secrets import SPACED_NAMES, values
from vllmwatch.config.redact import REDACT, REDACTED, Redactor

R = Redactor(known=False)
_RAW = ("\r", "\x0b", "\x0c", "\x85", "\u2028", "\u2029", "\xa0", "\u3000", "\x1c", "\x00",
        "\x07", "\x7f")
_ESCAPED = ("\\r", "\\t", "\\f", "\\v", "\\x0b", "\\x0c", "\\x85", "\\xa0", "\\u000b",
            "\\u2028", "\\u00a0", "\\\\f", "\\\\u2028")
_SEPARATORS = st.lists(st.sampled_from(_RAW + _ESCAPED + (" ", "\t")), min_size=1,
                       max_size=3).map("".join)
_FORMS = ("{n}{s}{v}", "{n}:{s}{v}", "{n}={s}{v}", "{n}{s}:{s}{v}", "--api-key{s}{v}",
          "--hf-token{s}{v}", "'{n}':{s}'{v}'", '"{n}"{s}:{s}"{v}"', "'{n}':{s}{v}")


@settings(max_examples=500, deadline=None)
@given(name=st.sampled_from(SPACED_NAMES), sep=_SEPARATORS, value=values,
       form=st.sampled_from(_FORMS), pre=st.sampled_from(("", "INFO ", "x\n", "print: ")),
       post=st.sampled_from(("", " --port 8000", "\n", ", n=1")))
def test_no_separator_between_a_secret_name_and_its_value_shows_the_value(
        name: str, sep: str, value: str, form: str, pre: str, post: str) -> None:
    text = pre + form.format(n=name, s=sep, v=value) + post
    for red in (R, REDACT):
        out = red.text(text)
        assert value not in out and REDACTED in out, (text, out)


def test_a_name_at_a_line_end_keeps_the_next_line() -> None:
    for text in ("HF_TOKEN\nDownloading", "HF_TOKEN\r\nDownloading", "HF_TOKEN\\nDownloading",
                 "HF_TOKEN\\u000aDownloading"):
        assert R.text(text) == text


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(SPACED_NAMES), value=values, glued=st.text(",;&)}]>", min_size=1,
                                                                       max_size=3),
       form=st.sampled_from(("{n}: {g}{v}", "{n}:{g}{v}", "{n} => {g}{v}", "'{n}': {g}{v}",
                             "{n}={g}{v}", "--{n}={g}{v}")),
       post=st.sampled_from(("", "\n", ", n=1", " # note")))
def test_a_value_that_begins_with_a_closing_sign_is_hidden(
        name: str, value: str, glued: str, form: str, post: str) -> None:
    """`password: >x9`, `)x9`, `]x9`, `,x9`, `&anchor`: as a value's first characters a closing
    sign closes nothing; the value after it was shown in clear."""
    text = form.format(n=name, g=glued, v=value) + post
    for red in (R, REDACT):
        out = red.text(text)
        assert value not in out and REDACTED in out, (text, out)
