"""Where a secret name's list, tuple or dict ends (`'api_key': ['K1', 'K2']`, `api_keys=('K1',)`,
`"api_key": [\\"K1\\"]` in JSON inside a string), and the text shown for it: each item hidden
whole, the brackets, the separators and what follows kept.

A list was taken to end at its first closer, and its items to be whatever quotes lay before
it, so a key holding a `]` (`['Zq9]K2']`) showed its rest. Now the list is read item by item:
a quoted item ends where config/secretvalues.py's QUOTED says a value in that quoting and
that nesting ends (its own quote, escaped as often as the one that opened it), whatever it
holds, and only a closer outside every item, matching its opener, closes the list. One pass:
each character is read once, and a list that never closes (a line cut short, a bracket that is
prose's) still ends where the reading stopped, everything before it hidden, and the caller goes
on from there, so no text is read twice for the many names of a hostile line
(tests/core/test_redact_linear.py). Pure: stdlib only."""

from __future__ import annotations

import re

from vllmwatch.config.secretvalues import QUOTED_ONLY, REDACTED

OPENERS = {"[": "]", "(": ")", "{": "}"}
# Between items: spaces, a line break escaped as the nesting escapes it (a pretty-printed list
# in a string), the separators of a list and of a dict (a dict's keys are hidden as its values
# were: each quoted string); an opener or a closer; a bare item (`[1, None]`, `[C:\x]`; a
# backslash run before a quote opens an escaped item: QUOTED's).
_TOKEN = re.compile(r"""(?P<skip>(?:\s|\\+[nrt]|[,:])+)|(?P<open>[\[({])|(?P<close>[\])}])"""
                    r"""|(?P<bare>(?:[^\s,:'"\\\[\](){}]|\\+(?![\\'"]))+)""")

# What a bare value holds (secretvalues' _BARE_WORD), glued to a list's closer
_GLUED = re.compile(r"""(?:<redacted>|(?!\\[nrt])[^\s'",;&)}\]>])+""")
# The rest of a word after another bracket's closer broke a list off (`api_key=[}K1`)
_WORD_REST = re.compile(r"""\S+""")


def hide_list(text: str, where: int) -> tuple[int, str]:
    """The end of the list that opens at `where` (after its closer, or where it stopped being
    one) and its text with every item hidden, a bare one too: a bare value that opened with a
    bracket (`api_key=(K1 (x)"`) is read as a list, its words as items. One of bare items only
    is hidden whole (`[<redacted>]`), as it always was."""
    parts = [text[where]]
    ends = [OPENERS[text[where]]]
    pos = where + 1
    quoted = broken = False
    while ends and pos < len(text):
        item = QUOTED_ONLY.match(text, pos)
        if item is not None:
            quoted = True
            if item["eqv"] is not None:
                quote = item["esc"] + item["evq"]
            else:
                quote = ("b" if item[0].startswith("b") else "") + item["vq"]
            parts.append(f"{quote}{REDACTED}{quote.lstrip('b')}")
            pos = item.end()
            if _ambiguous(item):  # where it ends is a guess: hide the rest of the line
                pos = len(text) if (stop := text.find("\n", pos)) < 0 else stop
                break
            continue
        token = _TOKEN.match(text, pos)
        if token is None or (token["close"] and token["close"] != ends[-1]):
            # no list's: it ends here (a backslash of prose, another bracket's closer)
            broken = token is not None
            break
        if token["open"]:
            ends.append(OPENERS[token["open"]])
        elif token["close"]:
            ends.pop()
        parts.append(REDACTED if token["bare"] else token[0])
        pos = token.end()
    closer = "" if ends else parts[-1]
    # `api_key=[K1]K2`: a bare value that opened with a bracket (its rest was shown), no list:
    # a space, a quote or a sign follows one; `api_key=[}K1`: another bracket's closer broke
    # the reading off inside the word, whose rest is the value's (it was shown)
    glued = _GLUED.match(text, pos) if not ends else _WORD_REST.match(text, pos) if broken \
        else None
    if glued is not None:
        pos = glued.end()
        parts.append(REDACTED)
    if not quoted:  # nothing but bare items and brackets
        return pos, f"{text[where]}{REDACTED}{closer}{REDACTED if glued else ''}"
    return pos, "".join(parts)


# A backslash run before the item's own quote, inside it (QUOTED takes it as the value's).
# Each level of nesting doubles a run (repr() of text quoted with the other quote) or doubles
# it and adds one (JSON, or repr() escaping the quote): a quote the value escaped (an odd run
# n at its level) and a backslash that ends the value (an even n, then the closing quote) can
# have the same run here once an unknown number of levels doubled it: `"K\\"` is JSON's
# `K\` closed, or repr() of JSON's `K\"` going on. The run of the quote that opened the item
# (e) says the levels since the first that escaped it (its bit length, L): a run r = e + 2^L n
# with n odd is the value's quote whatever came before; any other run is a guess. A wrong
# guess in a list reads the next item's inside as the list's text (its `]` closing the list,
# the rest of the key shown), so a list with one is hidden to the line's end.
_RUN = re.compile(r"""(?<!\\)\\+(?=['"])""")


def _ambiguous(item: re.Match[str]) -> bool:
    quote, e, inside = (item["vq"], 0, item["qv"]) if item["eqv"] is None else (
        item["evq"], len(item["esc"]), item["eqv"])
    step = 1 << e.bit_length()
    for run in _RUN.finditer(inside):
        if inside[run.end()] == quote and ((len(run[0]) - e) % (2 * step) != step):
            return True
    return False


# A YAML value on the lines after `name:`: a block sequence (`api_key:` then `  - K1`, `  - K2`)
# or a block scalar (`api_key: |` then `  K1`); the line break before them, raw or escaped as
# the text's nesting escapes it (YAML in a JSON string)
_BREAK = re.compile(r"\n|\\+n")
_CR = re.compile(r"(?:\r|\\+r)$")  # (`\r\n`: the `\r` is the line break's, kept)
_INDENT = re.compile(r"(?:[ \t]|\\+t)*")  # (escaped as the break is)
_ITEM = re.compile(r"-(?:[ \t]|(?:\r|\\+r)?$)")
# What opens such a value, read before any scan for the line's end (a hostile line of many
# `key: |x` would scan to its end once each): an item's `- `, or `-`, `|`, `>-` and its line's
# end, a bounded comment before it
_HEAD = re.compile(r"-[ \t]|(?P<scalar>[|>][-+0-9]{0,3}(?:[ \t]+#[^\n\\]{0,64}+)?)?"
                   r"(?(scalar)|-)[ \t]*(?:\r|\\+r)?(?:\n|\\+n|$)")


def hide_block(text: str, where: int, gap: str) -> tuple[int, str] | None:
    """The end of the YAML block value at `where` and its text with every line of it hidden: a
    sequence's items (each later line at the first `-`'s column that opens with `-`) or a
    scalar's text, and each line deeper than the items or the key (an item's nested map, a
    scalar's lines), blank lines between too. Read as one value, it was its first `-` or `|`,
    and every line after it was shown. Each line is read once; the line breaks, the indents,
    the dashes and `|` are kept. None: no such value (`-5`, `-----BEGIN`, `|x`)."""
    if (head := _HEAD.match(text, where)) is None:
        return None
    broke = list(_BREAK.finditer(gap))  # the break as the text writes one: raw or escaped
    after = _BREAK.search(text, where) if not broke else None
    nl = broke[-1][0] if broke else after[0] if after else "\n"
    end = text.find(nl, where)
    end = len(text) if end < 0 else end
    line_start = text.rfind(nl, 0, where)
    line_start = line_start + len(nl) if line_start >= 0 else 0
    key = _INDENT.match(text, line_start).end() - line_start  # type: ignore[union-attr]
    if head["scalar"]:  # a scalar's lines: deeper than the key
        column, deeper, shown = -1, key, [text[where:end]]
    else:  # items at the first one's column; deeper: than the key when it shares the key's
        column = where - line_start  # line (`key: - K1`, which YAML refuses; a log may not)
        deeper = column if broke else key
        shown = [f"- {REDACTED}{_suffix(text[where:end])}"]
    kept, pos = 1, end + len(nl)
    while end < len(text):
        line_end = text.find(nl, pos)
        line_end = len(text) if line_end < 0 else line_end
        indent = _INDENT.match(text, pos).end() - pos  # type: ignore[union-attr]
        rest = text[pos + indent:line_end]
        body = _CR.sub("", rest)
        item = indent == column and _ITEM.match(rest) is not None
        if not item and not (indent > deeper and body.strip()):
            if body.strip() or line_end == len(text):  # a key, a shallower line: the end
                break
            shown.append(text[pos:line_end])  # a blank line: the next one says
        else:
            value = body[1:] if item else body
            shown.append(text[pos:pos + indent] + ("-" if item else "") + (
                (" " if item else "") + REDACTED if value.strip() else "") + _suffix(rest))
            kept, end = len(shown), line_end
        pos = line_end + len(nl)
    return end, nl.join(shown[:kept])


def _suffix(line: str) -> str:
    cr = _CR.search(line)
    return cr[0] if cr else ""
