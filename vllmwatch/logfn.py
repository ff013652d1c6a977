"""The one logging signature of vllmwatch: `log(level, event, **fields)`.

`event` is a stable dotted name (`restart.begin`), `level` one of debug, info, warning,
error, critical; fields are key/values. shell/logs.py makes the real one; tests pass
collectors with the same signature. Kept here, apart from shell/, so that config/ and
prewarm/ can name the type without importing the shell.
"""

from __future__ import annotations

from typing import Any, Protocol


class LogFn(Protocol):
    """log(level, event, **fields)."""

    def __call__(self, level: str, event: str, **fields: Any) -> None: ...
