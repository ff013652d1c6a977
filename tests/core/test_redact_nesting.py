"""A secret value of any characters, under a secret name, in every nesting a log line carries
(config/secretnames.py's value rules): `key=value`, JSON, a Python dict's repr, a shell's
quoting, then JSON-encoded or repr()'d once or twice more (an error that quotes a request
body, a log line inside a record). A quote in the value is escaped once more than the quotes
around it at each level; when repr() doubled the backslash of JSON's `\\"` the value ended
there (`"a\\\\"b"`) and the rest of the secret was written out."""

from __future__ import annotations

import json
import re
import shlex
import string
from collections.abc import Callable

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from vllmwatch.config.redact import REDACTED, Redactor
from vllmwatch.config.secretnames import path_value

R = Redactor(known=False)
# The value's distinctive parts: capitals that are no hex digit and no escape's letter, so no
# `\u00e9`, `\x7f` or `\n` an encoder writes can spell one, and no word a rule reads as prose
# or as a scheme (`none`, `NTLM`).
_MARK = "GJQVWXYZ"
_MARKED = re.compile(f"[{_MARK}]{{4,}}")
_CHUNKS = st.text(_MARK, min_size=4, max_size=8)
# Between them, any character but an ASCII letter (a lower-case word may be prose by design:
# `--api-key 'the key is ..'`), and the signs that end values: quotes, escapes, the shell's
# `'"'"'`, brackets, separators, spaces, line breaks, non-ASCII.
_SIGNS = st.one_of(
    st.text(st.characters(exclude_characters=string.ascii_letters, exclude_categories=["Cs"]),
            min_size=1, max_size=3),
    st.sampled_from(['"', "'", "\\", '\\"', "\\\\", "\\'", "'\"'\"'", '", "', "': '", "}",
                     "]", ")", ",", ";", "=", "&", " ", "\t", "\n", "é", "\u2028", "😀"]))
_VALUES = st.lists(st.one_of(_CHUNKS, _SIGNS), min_size=2, max_size=8).map("".join).filter(
    lambda v: len(v) >= 8 and _MARKED.search(v) is not None)
_NAMES = st.sampled_from(["api_key", "API_KEY", "apiKey", "hf_token", "HF_TOKEN", "password",
                          "DB_PASSWORD", "client_secret", "access_token", "x-api-key"])
_FLAGS = st.sampled_from(["api-key", "hf-token", "client-secret", "password"])
_ENCODERS: dict[str, Callable[[str], str]] = {"json": json.dumps, "repr": repr}
# A bare value ends at a space, and where a quote or a closing sign meets a space, another
# sign or the line's end (`'api_key=x', ..`, `"api_key=x","n":1`, `Namespace(api_key=x, ..)`):
# a bare value with one of those inside cannot be told from one that ended there, nor one with
# a backslash (the writer's escape; `\n` is a line break in a repr) from one that did not, nor
# one that opens with a quote from a quoted one (`api_key="x"`).
_ENDS_INSIDE = re.compile(r"""^['"]|\s|\\|(?:['"]|[,)}\]>]+)(?=[\s'",)}\]>])""")


def _base(form: str, name: str, flag: str, value: str) -> str:
    """The first level: the value as one writer prints it."""
    if form == "plain":
        return f"request failed: {name}={value} (retrying)"
    if form == "shell":
        return f"+ exec vllm serve /m --{flag} {shlex.quote(value)} --port 8000"
    if form == "json":
        return json.dumps({"model": "/m", name: value, "port": 8000})
    return repr({"model": "/m", name: value, "port": 8000})


def _writable(form: str, value: str) -> bool:
    """Whether the form can carry the value so that a reader could know where it ends."""
    if form == "plain":
        return _ENDS_INSIDE.search(value) is None
    if form == "shell":  # one log line; `--x` after a flag is the next flag to argparse
        return "\n" not in value and not shlex.quote(value).startswith("--")
    return True


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["plain", "shell", "json", "dict"]), _NAMES, _FLAGS, _VALUES,
       st.lists(st.sampled_from(sorted(_ENCODERS)), max_size=2))
@example("json", "api_key", "api-key", 'QVWX"YZGJ\\QVWX', ["repr"])  # the reported leak
@example("plain", "api_key", "api-key", "[}GGGGGGGG", [])  # a list broken off in its word
@example("json", "password", "api-key", 'QVWX"YZGJ', ["json", "repr"])
@example("shell", "api_key", "api-key", "QVWX'YZGJ QVWX", ["json"])
@example("plain", "api_key", "api-key", 'QVWX"YZGJ', ["repr"])
def test_no_part_of_a_secret_survives_any_nesting(form: str, name: str, flag: str, value: str,
                                                  encoders: list[str]) -> None:
    assume(_writable(form, value) and not path_value(value))  # (a file's path is shown)
    text = _base(form, name, flag, value)
    skeleton = _base(form, name, flag, "")
    for encoder in encoders:
        text, skeleton = _ENCODERS[encoder](text), _ENCODERS[encoder](skeleton)
    line = f"ERROR 01-01 00:00:00 [server.py:1] {text} next"
    marks = _MARKED.findall(value)
    assume(not [m for m in marks if m in skeleton])  # no part of the text around it
    out = R.text(line)
    assert REDACTED in out and not [m for m in marks if m in out], (line, out)


@pytest.mark.parametrize(("text", "want"), [
    # repr() of JSON: the value's `\"` is `\\"`, read as an escaped backslash and the end
    (repr(json.dumps({"api_key": 'Zq9"K2', "n": 1})), """'{"api_key": "<redacted>", "n": 1}'"""),
    # shlex.quote's `'"'"'` (a `'` in the key), and a backslash before it (no escape in '..')
    ("+ vllm serve --api-key 'Zq9'\"'\"'K2' --port 8000", "+ vllm serve --api-key '<redacted>' "
     "--port 8000"),
    ("+ vllm serve --api-key 'Zq9\\'\"'\"'K2' -p 1", "+ vllm serve --api-key '<redacted>' -p 1"),
    # a quote, a comma inside a bare word: `api_key=Zq9"K2`, an argv's `--api-key Zq9,K2`
    ('failed: api_key=Zq9"K2 retry', "failed: api_key=<redacted> retry"),
    ("vllm serve --api-key Zq9,K2 --port 8000", "vllm serve --api-key <redacted> --port 8000"),
    # JSON in a string whose secret ends in a backslash: hidden to the line's end, not shown
    (json.dumps(repr({"api_key": "'Zq9K2\\"})), '"{\'api_key\': \\"<redacted>\\"'),
    # `=>` only before a space, a quote or a bracket: `api_key=>;K` is a value
    ("api_key=>;Zq9K2 x", "api_key=<redacted> x"),
    # and what closes the string the value sat in stays
    ("""['api_key=Zq9K2', "x"]""", """['api_key=<redacted>', "x"]"""),
    ('{"msg":"api_key=Zq9K2","n":1}', '{"msg":"api_key=<redacted>","n":1}'),
])
def test_each_nesting_hides_the_whole_value_and_keeps_what_closes_it(text: str,
                                                                     want: str) -> None:
    assert R.text(text) == want


# A secret LIST (vLLM's `--api-key K1 K2` kept as a list: `'api_key': ['K1', 'K2']`, a
# config's `api_keys=[..]`): a list was taken to end at its first closer, so a `]` inside a
# key (`['Zq9]K2']`) showed the rest of it. Its values as the property above makes them, a
# closer or a comma put inside some (a quote, a backslash, `', '` are among _SIGNS already).
_CLOSERS = st.sampled_from(["]", ")", "}", ",", "],", "']", '"]', "')", "'}", "\\]"])
_LIST_VALUES = st.one_of(_VALUES, st.tuples(_VALUES, _CLOSERS, st.integers(0, 24)).map(
    lambda t: t[0][:t[2]] + t[1] + t[0][t[2]:]))


def _listed(form: str, name: str, values: list[str], tuple_: bool) -> str:
    """The first level: the values as a list (a tuple in a repr) under the name."""
    held: list[str] | tuple[str, ...] = tuple(values) if tuple_ and form != "json" else values
    if form == "plain":  # a Python f-string's `{name}={keys!r}`
        return f"request failed: {name}={held!r} (retrying)"
    if form == "json":
        return json.dumps({"model": "/m", name: held, "port": 8000})
    return repr({"model": "/m", name: held, "port": 8000})


# No filter: each form is a repr or JSON, so every value is quoted and its inside escaped (a
# line break, a quote, a backslash), and no list item is judged as a file's path. The text
# around the values has no run of _MARK's capitals, so any run found in the output is a value's.
@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["plain", "json", "dict"]), _NAMES,
       st.lists(_LIST_VALUES, min_size=1, max_size=3), st.booleans(),
       st.lists(st.sampled_from(sorted(_ENCODERS)), max_size=2))
@example("dict", "api_key", ["Zq9]KXYZWQ2x"], False, [])  # the reported leaks
@example("json", "api_key", ["Zq9]KXYZWQ2x"], False, [])
@example("json", "api_key", ["GJQV]WXYZ", 'QV,"]WXYZ'], False, ["repr", "json"])
@example("dict", "api_key", ["GJQV', 'WXYZ", "QV\\"], True, ["json"])
def test_no_part_of_any_item_of_a_secret_list_survives_any_nesting(
        form: str, name: str, values: list[str], tuple_: bool, encoders: list[str]) -> None:
    text = _listed(form, name, values, tuple_)
    for encoder in encoders:
        text = _ENCODERS[encoder](text)
    line = f"ERROR 01-01 00:00:00 [server.py:1] {text} next"
    marks = [m for v in values for m in _MARKED.findall(v)]
    out = R.text(line)
    assert REDACTED in out and not [m for m in marks if m in out], (line, out)
    if not re.search(r"""['"\\]""", "".join(values)):  # the list's closer and the rest stay:
        # with no quote and no backslash in a value, no nesting escapes one inside an item, and
        # each item is written back in its own quotes. (A backslash run before an item's quote
        # may be where a nesting ended it: such a list is hidden to the line's end, by design.)
        want = _listed(form, name, [REDACTED] * len(values), tuple_)
        for encoder in encoders:
            want = _ENCODERS[encoder](want)
        assert out == f"ERROR 01-01 00:00:00 [server.py:1] {want} next", (line, out)


@pytest.mark.parametrize(("text", "want"), [
    # a closer, a comma inside an item: the item whole, the list's closer and the rest stay
    ("{'api_key': ['Zq9]K2x'], 'n': 1}", "{'api_key': ['<redacted>'], 'n': 1}"),
    ('{"api_key": ["Zq9]K2x", "a,b)"], "n": 1}',
     '{"api_key": ["<redacted>", "<redacted>"], "n": 1}'),
    ("api_keys=('Zq9)K2',) n=1", "api_keys=('<redacted>',) n=1"),
    # nested: repr() of JSON, json.dumps of a dict's repr (a quote escaped) and of JSON
    (repr(json.dumps({"api_key": ["Zq9]K2"]})), """'{"api_key": ["<redacted>"]}'"""),
    (json.dumps(repr({"api_key": ["Zq9'}K2"], "n": 1})),
     '"{\'api_key\': [\\"<redacted>\\"], \'n\': 1}"'),
    (json.dumps(json.dumps({"api_key": ["Zq9\\]K2"]})), '"{\\"api_key\\": [\\"<redacted>\\"]}"'),
    # bare items are hidden too; a list of them whole; a bare value that opened with a bracket
    ("{'api_key': ['Zq9K2', 7], 'n': 1}", "{'api_key': ['<redacted>', <redacted>], 'n': 1}"),
    ("api_keys=[1, 2] n", "api_keys=[<redacted>] n"),
    ("api_key=[Zq9]K2 n", "api_key=[<redacted>]<redacted> n"),
    # an item whose end a nesting may have moved (`\\"`: JSON's `K\` closed, or repr() of
    # JSON's `K"` going on): hidden to the line's end, as a guess could show the next item
    ('{"api_key": ["Zq9\\\\", "K2]x"], "n": 1}\nnext', '{"api_key": ["<redacted>"\nnext'),
])
def test_a_secret_list_hides_each_item_whole_and_keeps_its_closer(text: str, want: str) -> None:
    assert R.text(text) == want
