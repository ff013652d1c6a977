"""Quiet hours: a local-time window in which slow-leak restarts are allowed, spread per host."""

from __future__ import annotations

import hashlib
import re

_WINDOW = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$", re.ASCII)


def parse_window(text: str) -> tuple[int, int]:
    """Parse "HH:MM-HH:MM" into (start, end) minutes after midnight; may wrap midnight."""
    match = _WINDOW.match(text)
    if not match:
        raise ValueError("not a window")
    h1, m1, h2, m2 = (int(g) for g in match.groups())
    if h1 > 23 or h2 > 24 or m1 > 59 or m2 > 59 or (h2 == 24 and m2 != 0):
        raise ValueError("hours must be 00-23 and minutes 00-59")
    start, end = h1 * 60 + m1, h2 * 60 + m2
    if start == end:
        raise ValueError("start and end are the same")
    return start, end


def in_window(text: str, minute_of_day: int) -> bool:
    """True when the window is empty (no restriction) or contains the given local minute."""
    if not text:
        return True
    start, end = parse_window(text)
    if start < end:
        return start <= minute_of_day < end
    return minute_of_day >= start or minute_of_day < end


def _clock(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"


def host_offset(key: str, span: int) -> int:
    """A stable minute in [0, span) for this host key: the same key, the same minute."""
    if span <= 0:
        return 0
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % span


def spread(text: str, key: str, fraction: float) -> str:
    """The window with its start moved by a per-host offset into its first `fraction`.

    A fleet sharing one config then spreads its quiet-hours restarts over the window instead
    of all restarting the minute it opens. The result lies inside the window and keeps at
    least (1 - fraction) of it; "" and fraction 0 leave the window as it is.
    """
    if not text or fraction <= 0:
        return text
    start, end = parse_window(text)
    length = end - start if start < end else end + 1440 - start
    span = min(int(length * fraction), length - 1)
    if span < 1:
        return text
    new_start = (start + host_offset(key, span)) % 1440
    return f"{_clock(new_start)}-{_clock(end)}"
