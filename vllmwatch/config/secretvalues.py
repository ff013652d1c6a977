"""Where a secret's value ends, after its name (config/secretnames.py's rules find the name and
judge it; config/redact.py runs them): quoted, escaped once or more (JSON in a string), or
bare. Each pattern consumes a character one way, so a line costs one pass whatever it holds
(tests/core/test_redact_linear.py). Pure: stdlib only."""

from __future__ import annotations

import re

# 'value' / "value", or \"value\" (\\\"value\\\"): JSON inside a string, once or twice (a
# request body in an error message). A backslash is consumed with the character after it (or
# alone before a line's end), so an unclosed quote runs to the line's end in one pass (that
# prompt's secret is hidden too) and never backtracks: `(?:\\.|(?!q).)*` was exponential.
# An escaped value's backslash run is consumed whole, once: `(?!\\+q).` rescanned the run at
# each of its characters (quadratic: 4 s for 16 K backslashes). A quote escaped once more than
# the value's own (`\"K1\\\"K2\"`, a `"` in the secret) is part of the value, not its end.
QUOTED = (r"""(?:b?(?P<vq>['"])(?P<qv>(?:\\(?:.|(?!.))|(?!(?P=vq))[^\\\n])*)"""
          r"""(?:(?P=vq)|(?=\n)|\Z)"""
          r"""|(?P<esc>\\+)(?P<evq>['"])(?P<eqv>(?:[^\\\n]|\\+(?![\\]|(?P=evq))"""
          r"""|(?P=esc)\\+(?P=evq))*)"""
          r"""(?P=esc)(?P=evq))""")
# Space between a scheme and its credential, or its escape (`Bearer\\tX` in JSON-escaped text)
SPACE = r"(?:\s|\\+[tnr])+"
AUTH = (r"(?:bearer|basic|token|digest|apikey|negotiate|ntlm|splunk|sharedkey|hmac|"
        r"aws4-hmac-sha256):?" + SPACE)  # (`Bearer: X`)
# A value already hidden is left, not one a known value only began (`PASSWORD=<redacted>2024`);
# a value ends at an escaped line break too (a repr'd request: `Authorization: x\nX-Api-Key:`)
DONE = r"""<redacted>(?![^\s'",;&)}\]>])"""
_BARE = (r"""(?P<bare>(?!""" + DONE + "|" + AUTH
         + r""")(?:<redacted>|(?!\\[nrt])[^\s'",;&)}\]>])+)""")
# NAME=value as a shell or an env file writes it (at a line's or a word's start, not after
# `?`/`&` of a query): the value runs to the next space, `;` and `&` included (`DB_PASSWORD=
# abc;def` kept `;def`), but not a closing `,)}]>` before a space (`Namespace(api_key=x, n=1)`).
_ENV_BARE = (r"""(?P<bare>(?!<redacted>(?![^\s'",)}\]>])|""" + AUTH
             + r""")(?:<redacted>|(?!\\[nrt])[^\s'",)}\]>]|[,)}\]>]+(?=[^\s'",)}\]>]))+)""")
QUOTED_ONLY = re.compile(QUOTED)
VALUE = re.compile(QUOTED + "|" + _BARE)
VALUE_I = re.compile("(?i)" + QUOTED + "|" + _BARE)
ENV_VALUE_I = re.compile("(?i)" + QUOTED + "|" + _ENV_BARE)
# After `NAME `, a bracket begins a remark (`VLLM_API_KEY (environment)`), not a value.
SPACED_VALUE = re.compile("(?i)" + QUOTED + r"|(?![(\[{])" + _BARE)
# A quoted string inside a list, to its closing quote or the list's end (a quote never
# closed ran to the end at each quote after it: quadratic); a backslash takes the next
# character with it, so each is consumed one way.
IN_LIST = re.compile(r"""(['"])(?:\\[\s\S]|(?!\1)[^\\])*(?:\1|\\?\Z)""")
# The quoted items after an argv list's first key, each closed on its line, none a flag
MORE_ITEMS = re.compile(r"""(?:\s*,\s*b?(['"])(?!-)(?:\\.|(?!\1)[^\\\n])*\1)*""")
