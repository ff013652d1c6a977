"""The one logging signature of vllmwatch: `log(level, event, **fields)`.

`event` is a stable dotted name (`restart.begin`), `level` one of debug, info, warning,
error, critical; fields are key/values. shell/logs.py makes the real one; tests pass
collectors with the same signature. Kept here, apart from shell/, so that prewarm/, status/
and the other layers can name the type without importing the shell.

May import: nothing of vllmwatch (the stdlib only).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, Protocol


class LogFn(Protocol):
    """log(level, event, **fields)."""

    def __call__(self, level: str, event: str, **fields: Any) -> None: ...


class Repeats:
    """A repeated error logged once per `every` seconds with a count, not once per time.

    The first occurrence of a key is logged at once with all its fields; later ones within
    `every` are counted, and the next one after it is logged with `repeated=N` (how many were
    not logged since) and without `drop_on_repeat` fields (a traceback is worth reading once).
    Thread-safe.
    """

    def __init__(self, log: LogFn, clock: Callable[[], float], every: float = 60.0) -> None:
        self.log, self.clock, self.every = log, clock, every
        self._last: dict[Hashable, float] = {}
        self._count: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def __call__(self, key: Hashable, level: str, event: str,
                 drop_on_repeat: tuple[str, ...] = (), **fields: Any) -> bool:
        """Log (or count) one occurrence; True when it was logged."""
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.every:
                self._count[key] = self._count.get(key, 0) + 1
                return False
            repeated = self._count.pop(key, 0)
            self._last[key] = now
        if last is not None:
            fields = {k: v for k, v in fields.items() if k not in drop_on_repeat}
            fields["repeated"] = repeated
            fields["since_last_s"] = round(now - last, 1)
        self.log(level, event, **fields)
        return True
