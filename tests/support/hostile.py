"""Lines shaped to make the redactor's rules rescan what they already scanned (a backslash
run, a quote run, a name repeated, a list never closed), after each secret word its rules
know: tests/core/test_redact_linear.py times them against a plain line of the same length."""

from __future__ import annotations

import time
from collections.abc import Callable

# Each word a rule starts at (a name, a flag, a header, a scheme, encoded, a URL's userinfo)
WORDS = ("token", "password", "api_key", "key", "secret", "auth", "cookie", "sig", "DB_PW",
         "SLACK_WEBHOOK_URL", "--api-key", "'api_key'", "\\\"token\\\"", "('authorization'",
         "Authorization:", "bearer", "api%5Fkey", "x://u", "-----BEGIN ")
SEPARATORS = ("", "=", ": ", " ", " => ", "%3D", "', ", "\\\":\\\"", "='")
# Each repeated to the line's length: what one rule scans for, with nothing that ends it
PIECES = ("\\", "\\\"", "\\'", "'", '"', "key=", "token=[,", "token=(,", "token={,", "%5C",
          "%5F", " ", "\t", "'key': ", "\\\"key\\\": \\\"", "eyJ-", "a://:", "token%3D",
          "--api-key ", "hf_token ", "HF_TOKEN a ", "bearer ", "=>", "key=\\\"", "key=\\\\\"",
          "token: bearer ", "'--api-key', 'a', '", "\"--api-key\", \"a\", \"",
          "--api-key -- ", "-api-key ", "-hf-token -- -", "a://u:\"", "a://:\"@",
          "--api-key \\\n", "token: \\\\\\n", "token=a\r", "--api-key a\x0b", "a\u2028",
          "token:\\\\r\\t", "--api-k a ",
          "Authorization: X a=\"", "Authorization: X a=b, ", "bearer:", "a=\"b\", ",
          "curl -u a:", "curl -u 'a", "curl -uuuuuuuuuu", "curl --user ",
          "mysql -p", "sshpass -v", " login -p", "redis-cli -a", "--api-key 'a' '", '--api-key a "',
          "'name': 'HF_TOKEN', 'value': '", "name: HF_TOKEN\n value: \\", "name: key\n",
          ";jsessionid=", "&sid=a", "?sid=;",
          "'token', ", "x\\\\'", "sk-", "%20", "['", "[\\'", "token=\\\\")
MIXES = ("key=\\\"" + "\\" * 64, "token='" + "\\'" * 8, "a " * 8 + "\\" * 16,
         "password=%5C%5C" + "\\" * 8)


def shapes(size: int) -> dict[str, str]:
    """Hostile lines of `size` characters: a word, a separator, a piece repeated (each piece
    after each word, and after `token` with each separator)."""
    out = {}
    pieces = PIECES + MIXES
    combos = [(word, SEPARATORS[(i + j) % len(SEPARATORS)], piece)
              for i, word in enumerate(WORDS) for j, piece in enumerate(pieces)]
    combos += [("token", sep, piece) for sep in SEPARATORS for piece in pieces]
    for word, sep, piece in combos:
        head = word + sep
        out[f"{head!r}+{piece!r}*"] = head + (piece * (size // len(piece) + 1))[:size - len(head)]
    return out


def best(action: Callable[[], object], runs: int = 3) -> float:
    """The least of `runs` timings (seconds): the others are the box's noise."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)
