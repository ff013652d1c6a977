"""Quiet hours: a local-time window in which slow-leak restarts are allowed."""

from __future__ import annotations

import re

_WINDOW = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


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
