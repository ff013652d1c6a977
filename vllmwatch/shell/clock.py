"""Time, injected: the loop reads time only through a Clock so tests can drive it."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time for intervals and deadlines, wall time only for humans."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary start; never goes back."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch, for timestamps people read."""
        ...

    def minute_of_day(self) -> int:
        """Local minutes after midnight, for quiet hours."""
        ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        """time.monotonic()."""
        return time.monotonic()

    def wall(self) -> float:
        """time.time()."""
        return time.time()

    def minute_of_day(self) -> int:
        """Local time of day in minutes."""
        t = time.localtime()
        return t.tm_hour * 60 + t.tm_min
