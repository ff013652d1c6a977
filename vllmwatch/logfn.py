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


KEYS_MAX = 1024  # keys remembered at once; a key is a failure's kind, this is never reached


class Repeats:
    """A repeated error logged once per `every` seconds with a count, not once per time.

    The first occurrence of a key is logged at once with all its fields; later ones within
    `every` are counted, and the next one after it is logged with `repeated=N` (how many were
    not logged since) and without `drop_on_repeat` fields (a traceback is worth reading once).
    `flush` logs the counts nobody reported yet: an error that stops repeating still says how
    often it came. Thread-safe.
    """

    def __init__(self, log: LogFn, clock: Callable[[], float], every: float = 60.0) -> None:
        self.log, self.clock, self.every = log, clock, every
        self._last: dict[Hashable, float] = {}
        self._count: dict[Hashable, int] = {}
        # what a count is reported as: the level, event and fields of the key's last call
        self._said: dict[Hashable, tuple[str, str, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def __call__(self, key: Hashable, level: str, event: str,
                 drop_on_repeat: tuple[str, ...] = (), **fields: Any) -> bool:
        """Log (or count) one occurrence; True when it was logged."""
        now = self.clock()
        short = {k: v for k, v in fields.items() if k not in drop_on_repeat}
        with self._lock:
            self._said[key] = (level, event, short)
            last = self._last.get(key)
            if last is None and len(self._last) >= KEYS_MAX:
                self._forget_one()
            if last is not None and now - last < self.every:
                self._count[key] = self._count.get(key, 0) + 1
                return False
            repeated = self._count.pop(key, 0)
            self._last[key] = now
        if last is not None:
            fields = {**short, "repeated": repeated, "since_last_s": round(now - last, 1)}
        self.log(level, event, **fields)
        return True

    def _forget_one(self) -> None:
        """Make room for a new key: the one logged longest ago (its count is lost: a
        thousand different failures at once say enough in the ones logged)."""
        key = min(self._last, key=self._last.__getitem__)
        for table in (self._last, self._count, self._said):
            table.pop(key, None)

    def flush(self, force: bool = False) -> int:
        """Log each key's uncounted repeats once its `every` has passed (all of them when
        force: on the way out); the number of events logged."""
        now = self.clock()
        due: list[tuple[str, str, dict[str, Any]]] = []
        with self._lock:
            for key, count in list(self._count.items()):
                last = self._last[key]
                if force or now - last >= self.every:
                    del self._count[key]
                    self._last[key] = now
                    level, event, fields = self._said[key]
                    # only_count: this line is no new occurrence, it counts the unlogged ones
                    due.append((level, event, {**fields, "repeated": count, "only_count": True,
                                               "since_last_s": round(now - last, 1)}))
        for level, event, fields in due:
            self.log(level, event, **fields)
        return len(due)
