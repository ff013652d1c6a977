"""The accepted range of every number in the config: finite, above a floor, below a ceiling.

A value that switches a rule off, or makes the daemon spin, must never pass by accident:
nan and inf are refused everywhere, 0 only where the key says what 0 means, and intervals
have a floor that keeps vllmwatch's own CPU use bounded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DAY = 86400.0
MIB_PER_PIB = float(2**30)


_DURATION_STEPS = (("d", DAY), ("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 0.001))
_SIZE_STEPS = (("PiB", MIB_PER_PIB), ("TiB", 2.0**20), ("GiB", 1024.0), ("MiB", 1.0),
               ("KiB", 1 / 1024))


@dataclass(frozen=True)
class Bounds:
    """low <= value <= high; 0 is accepted only when `zero` says what it means."""

    low: float
    high: float
    zero: str | None = None
    unit: str = ""

    def describe(self) -> str:
        """What is accepted, for an error message and the documentation."""
        low = "above 0" if self.low == 0 else self._fmt(self.low)
        text = f"{low} to {self._fmt(self.high)}"
        return text + (f", or 0 ({self.zero})" if self.zero else "")

    def _fmt(self, value: float) -> str:
        steps = {"s": _DURATION_STEPS, "MiB": _SIZE_STEPS, "MiB/h": _SIZE_STEPS}.get(self.unit)
        if steps is None:
            return str(int(value)) if value == int(value) else f"{value:g}"
        for name, size in steps:
            if (value >= size and value % size == 0) or name == steps[-1][0]:
                suffix = "/h" if self.unit == "MiB/h" else ""
                return f"{value / size:g}{name}{suffix}"
        return f"{value:g}"  # pragma: no cover - the last step always matches

    def problem(self, value: float) -> str | None:
        """Why value is refused, or None when it is accepted."""
        if not math.isfinite(value):
            return "must be a finite number"
        if value == 0 and self.zero is not None:
            return None
        if value == 0:
            return "0 is not accepted here (it does not mean off)"
        if value < 0:
            return "must not be negative"
        if value < self.low:
            return f"is below the floor of {self._fmt(self.low)}"
        if value > self.high:
            return f"is above the ceiling of {self._fmt(self.high)}"
        return None


# What each numeric kind accepts unless the field narrows it (metadata low/high/zero).
DEFAULTS: dict[str, Bounds] = {
    "duration": Bounds(0.1, 30 * DAY, unit="s"),
    "size": Bounds(1.0, MIB_PER_PIB, zero="off", unit="MiB"),
    "rate": Bounds(1.0, MIB_PER_PIB, zero="off", unit="MiB/h"),
    "fraction": Bounds(0.0, 1.0),
    "pos_float": Bounds(1.0, 100.0),
    "pos_int": Bounds(1.0, 1_000_000.0),
    "auto_int": Bounds(1.0, 1_000_000.0, zero="auto"),
    "port": Bounds(1.0, 65535.0),
}


def bounds_of(kind: str, meta: Mapping[str, Any]) -> Bounds | None:
    """The bounds of a field of this kind with this metadata; None for non-numeric kinds."""
    base = DEFAULTS.get(kind)
    if base is None:
        return None
    return Bounds(low=float(meta.get("low", base.low)), high=float(meta.get("high", base.high)),
                  zero=meta.get("zero", base.zero), unit=base.unit)
