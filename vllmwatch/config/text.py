"""Text from outside (a /status answer, vLLM's output, an incident record) made safe to print
on a person's terminal: control characters are shown as escapes, never sent raw."""

from __future__ import annotations

import re

# C0 and C1 controls and DEL, except newline and tab: ESC alone can retitle a terminal, move
# the cursor over earlier lines or hide text (a foreign service on the status port, or a
# line vLLM's output carried into a record).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str, keep_newlines: bool = True) -> str:
    """``text`` with every control character as a visible ``\\xNN`` escape (newline and tab
    kept, or escaped too when ``keep_newlines`` is False: a one-line field)."""
    out = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    if not keep_newlines:
        out = out.replace("\n", "\\n").replace("\t", "\\t")
    return out
