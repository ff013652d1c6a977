"""Parse and format the durations, sizes, rates and quiet-hours windows that the config
accepts (a window is a local-time span in which slow-leak restarts are allowed, spread per
host)."""

from __future__ import annotations

import hashlib
import math
import re

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)", re.ASCII)

# Binary units are the norm for memory; decimal ones are accepted because people write them.
_SIZE_UNITS_MIB = {
    "b": 1 / 2**20,
    "kib": 1 / 1024,
    "k": 1 / 1024,
    "kb": 1000 / 2**20,
    "mib": 1.0,
    "m": 1.0,
    "mb": 1000**2 / 2**20,
    "gib": 1024.0,
    "g": 1024.0,
    "gb": 1000**3 / 2**20,
    "tib": 1024.0**2,
    "t": 1024.0**2,
    "tb": 1000**4 / 2**20,
    "pib": 1024.0**3,  # the sizes' ceiling (config/bounds.py) is written so
    "p": 1024.0**3,
    "pb": 1000**5 / 2**20,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$", re.ASCII)
_PER_HOUR = re.compile(r"\s*/\s*(h|hr|hour)\s*$", re.IGNORECASE)

DURATION_HELP = ('seconds as a number, or a string such as "500ms", "30s", "15m", "2h", "1h30m" '
                 '(each unit once, the largest first)')
SIZE_HELP = 'MiB as a number, or a string such as "512MiB", "75000MiB", "70GiB"'
RATE_HELP = 'MiB per hour as a number, or a string such as "200MiB/h", "1GiB/h"'


def parse_duration(value: object) -> float:
    """Return seconds for a number or a string like "1h30m"; raise ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a duration")
    if isinstance(value, (int, float)):
        return _finite(float(value))
    if not isinstance(value, str):
        raise ValueError("not a duration")
    text = value.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", text, re.ASCII):
        return float(text)
    pos, total, last = 0, 0.0, math.inf
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos and text[pos : match.start()].strip():
            raise ValueError("not a duration")
        unit = _DURATION_UNITS[match.group(2)]
        if unit >= last:  # "1h1h" (2 h?) or "30m1h": a typo, not a duration to guess at
            raise ValueError(f"{match.group(2)!r} after a unit as small or smaller; write "
                             "each unit once, the largest first (1h30m)")
        total, pos, last = total + float(match.group(1)) * unit, match.end(), unit
    if pos == 0 or text[pos:].strip():
        raise ValueError("not a duration")
    return _finite(total)


def parse_size_mib(value: object) -> float:
    """Return MiB for a number (MiB) or a string like "70GiB"; raise ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a size")
    if isinstance(value, (int, float)):
        return _finite(float(value))
    if not isinstance(value, str):
        raise ValueError("not a size")
    match = _SIZE.match(value)
    if not match:
        raise ValueError("not a size")
    unit = match.group(2).lower() or "mib"
    if unit not in _SIZE_UNITS_MIB:
        raise ValueError(f"unknown unit {match.group(2)!r}")
    return _finite(float(match.group(1)) * _SIZE_UNITS_MIB[unit])


def _finite(value: float) -> float:
    """nan and inf switch rules off or overflow timers: never a valid duration or size."""
    if not math.isfinite(value):
        raise ValueError("must be a finite number, not nan or inf")
    if value < 0:
        raise ValueError("must not be negative")
    return value


def parse_rate_mib_per_h(value: object) -> float:
    """Return MiB per hour for a number or a string like "200MiB/h"."""
    if isinstance(value, str):
        value = _PER_HOUR.sub("", value)
    return parse_size_mib(value)


def format_duration(seconds: float) -> str:
    """Format seconds compactly for humans: 95 -> "1m35s"."""
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 and seconds != int(seconds) else f"{seconds:.0f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def format_mib(mib: float) -> str:
    """Format MiB for humans: 75000 -> "73.2GiB"."""
    if abs(mib) >= 1024:
        return f"{mib / 1024:.1f}GiB"
    return f"{mib:.0f}MiB"


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
