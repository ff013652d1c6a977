"""Where a secret's value ends, after its name (config/secretnames.py's rules find the name and
judge it; config/redact.py runs them): quoted, escaped once or more (JSON in a string, a
repr of JSON, of a shell's line), or bare.

At each level of JSON-encoding or repr() a quote inside the value is escaped once more than
the quotes around it, so a quoted value ends only at its own quote escaped as often as the one
that opened it; every other quote, whatever its backslashes, is part of the value. Each
pattern consumes a character one way and a value never fails once it began (an unclosed quote
runs to the line's end, that prompt's secret hidden too), so a line costs one pass whatever
it holds (tests/core/test_redact_linear.py). Pure: stdlib only."""

from __future__ import annotations

import re

REDACTED = "<redacted>"
# A terminal's colour (SGR) code, raw or escaped once or more as a log or JSON writes it (from
# a backslash run's first only: tried at each, a long run was rescanned, quadratic)
COLOURS = re.compile(r"(?:\x1b|(?<!\\)\\+(?:x1b|u001b|033|e))\[[0-9;]{0,32}m")
# A space or a control character, raw or as an escape sequence writes it (`\\f`, `\\x0b`,
# `\\u2028`, once or more), between a name or a scheme and the value (`HF_TOKEN\rK`: a terminal
# shows K alone; `Bearer\\tX` JSON-escaped): any of them separates, none is part of the value
CONTROL = r"[\s\x00-\x08\x0e-\x1f\x7f]"
ESCAPED = (r"\\+(?:[nrtfv]|x(?:[01][0-9a-fA-F]|20|7[fF]|85|[aA]0)|u(?:00(?:[01][0-9a-fA-F]|20|"
           r"7[fF]|85|[aA]0)|1680|20[0-2][0-9a-fA-F]|205[fF]|3000))")
SPACE = r"(?:" + CONTROL + "|" + ESCAPED + ")+"
# A shell's line continuation (`\` and a line break, raw or JSON-escaped, `\\\n`): the shell
# joins the lines, so what follows is the same word list (`--api-key \` then the key, shown)
CONTINUED = r"(?:\\\r?\n|\\{3,}(?:r\\+)?n)"
AUTH = (r"(?:bearer|basic|token|digest|apikey|negotiate|ntlm|splunk|sharedkey|hmac|"
        r"aws4-hmac-sha256):?" + SPACE)  # (`Bearer: X`)
# A value already hidden is left, not one a known value only began (`PASSWORD=<redacted>2024`);
# a value ends at an escaped line break too (a repr'd request: `Authorization: x\nX-Api-Key:`)
DONE = r"""<redacted>(?![^\s'",;&)}\]>])"""
# 'value' / "value", or \"value\" (\\\"value\\\"): JSON inside a string, once or twice (a
# request body in an error message).
# Unescaped (`"K"`), a backslash run is taken whole with the character after it, a quote too:
# repr() of JSON doubles the backslash of `"K1\"K2"` (`'{"k": "K1\\"K2"}'`), and `\\` then
# `"` read as an escaped backslash and the value's end left K2 in clear. The cost: a value
# ending in a backslash (`"C:\\"`) runs on to the next quote, hiding a little more.
# Escaped (`\"K\"`), the run is consumed whole, once: `(?!\\+q).` rescanned the run at each
# of its characters (quadratic: 4 s for 16 K backslashes); a quote escaped more than the
# value's own (`\"K1\\\"K2\"`) is part of the value, so one whose secret ends in a backslash
# runs on: ended by nothing, the value is hidden to the line's end (it failed, and the bare
# rule hid a backslash and showed the secret).
# Either way, a shell's `'"'"'` (shlex.quote's `'` inside '..', as `set -x` and shlex.join
# print it), escaped as the value's quotes are, continues the value: it is no end. A backslash
# run before it is the secret's own (in '..' a backslash is no escape), not the idiom's.
_IDIOM = r"""(?=')(?P=vq)\\*"(?P=vq)\\*"(?P=vq)"""
_ESC_IDIOM = r"""(?P=esc)(?=')(?P=evq)\\*"(?P=esc)(?P=evq)\\*"(?P=esc)(?P=evq)"""
QUOTED = (r"""(?:b?(?P<vq>['"])(?P<qv>(?:\\+(?=""" + _IDIOM + ")|" + _IDIOM
          + r"""|\\+(?:[^\\\n]|(?!.))|(?!(?P=vq))[^\\\n])*)"""
          r"""(?:(?P=vq)|(?=\n)|\Z)"""
          r"""|(?P<esc>\\+)(?P<evq>['"])(?P<eqv>(?:[^\\\n]|\\+(?![\\]|(?P=evq))"""
          r"""|\\+(?=""" + _ESC_IDIOM + ")|" + _ESC_IDIOM + r"""|(?P=esc)\\+(?P=evq))*)"""
          r"""(?:(?P=esc)(?P=evq))?)""")  # (unclosed: ended by nothing)
# A bare value, to a space or a sign. A quote inside its word is part of it (`api_key: K1"K2`,
# escaped or not once the line is JSON-encoded: `K1\"K2`; it ended there and showed `"K2`);
# one before a space or a sign closes the string the value sat in (`'api_key: K'`), and
# stays. Not after `NAME ` (SPACED_VALUE), where such a word is prose's (`Token token="X"`).
# A space no shell splits a word at (`\r`, `\x0b`, `\x0c`, `\x85`, `\u2028`, NBSP): inside a
# word it is the value's (`--api-key K1\rK2` is one key, and a terminal shows K2 at the line's
# start, in clear); before a space or a line's end (`K\r\n`) it ends the value, as \s did
JOINED = r"""[^\S \t\n](?=[^\s'",;&)}\]>])"""
_BARE_WORD = r"""(?:<redacted>|(?!\\[nrt])[^\s'",;&)}\]>]|""" + JOINED
# A value may begin with a closing sign glued to it (`password: >x9`, `)x9`, `&anchor`): as
# a value's first character it closes nothing, and the rest was shown in clear
_BARE = (r"""(?P<bare>(?:[,;&)}\]>]+(?=[^\s'",;&)}\]>]))?(?!""" + DONE + "|" + AUTH + ")"
         + _BARE_WORD + r"""|['"](?=[^\s'",;&)}\]>]))+)""")
_SPACED_BARE = r"""(?P<bare>(?!""" + DONE + "|" + AUTH + ")" + _BARE_WORD + ")+)"
# NAME=value as a shell or an env file writes it (at a line's or a word's start, not after
# `?`/`&` of a query), and an argv's `--flag value`: the value runs to the next space, `;` and
# `&` included (`DB_PASSWORD=abc;def` kept `;def`), but not a closing `,)}]>` before a space,
# a quote or an escaped one (`Namespace(api_key=x, n=1)`, `\"api_key=x\",\"n\"`); a quote
# inside the word is part of it, as in a bare value above (`api_key=K1"K2`).
_IN_WORD = (r"""(?!\\[nrt])[^\s'",)}\]>]|[,)}\]>]+(?=[^\s'",)}\]>\\]|\\+[^\\'"])"""
            r"""|['"](?=[^\s'",)}\]>])|""" + JOINED)
_ENV_BARE = (r"""(?P<bare>(?!<redacted>(?![^\s'",)}\]>])|""" + AUTH
             + r""")(?:<redacted>|""" + _IN_WORD + ")+)")
QUOTED_ONLY = re.compile(QUOTED)
VALUE = re.compile(QUOTED + "|" + _BARE)
VALUE_I = re.compile("(?i)" + QUOTED + "|" + _BARE)
ENV_VALUE_I = re.compile("(?i)" + QUOTED + "|" + _ENV_BARE)
# After `NAME `, a bracket begins a remark (`VLLM_API_KEY (environment)`), not a value.
SPACED_VALUE = re.compile("(?i)" + QUOTED + r"|(?![(\[{])" + _SPACED_BARE)
# A quoted string among an argv list's MORE_ITEMS, to its closing quote or their end (a
# quote never closed ran to the end at each quote after it: quadratic); a backslash run takes
# the next character with it (as QUOTED's), so each is consumed one way. (A secret name's own
# list is read item by item by QUOTED: config/secretlists.py.)
IN_LIST = re.compile(r"""(['"])(?:\\+(?:[^\\]|\Z)|(?!\1)[^\\])*(?:\1|\Z)""")
# The quoted items after an argv list's first key, each closed on its line, none a flag
MORE_ITEMS = re.compile(r"""(?:\s*,\s*b?(['"])(?!-)(?:\\+[^\\\n]|(?!\1)[^\\\n])*\1)*""")

# How far back an excerpt's end (Redactor.tail) looks for the start of the line, or the BEGIN
# of the private key, that its first character is in
LINE_CAP = 1 << 16
_PEM_END = re.compile(r"-----END [A-Z ]{0,40}PRIVATE KEY-----")


def tail_window(text: str, size: int) -> str:
    """What Redactor.tail redacts to keep the last characters of `text`: the last `size`, from
    the start of the line they begin in, or from the BEGIN of a private key whose END they hold
    (a value whose name or BEGIN was cut off matched no rule: its end was shown), LINE_CAP
    back at most; a key's END with no BEGIN so near hides all before it."""
    start = len(text) - size
    if start <= 0:
        return text
    floor = max(0, start - LINE_CAP)
    end = _PEM_END.search(text, start)
    if end is not None and "-----BEGIN" not in text[start:end.start()]:
        begin = text.rfind("-----BEGIN", floor, start)
        return text[begin:] if begin >= 0 else REDACTED + text[end.start():]
    line = text.rfind("\n", floor, start)
    return text[line + 1 if line >= 0 else floor:]
