"""The values vllmwatch reads from a model's config.json (its context length, its KV cache
layout, its architectures), each checked for what vLLM and transformers accept there.

A config.json is the model's, not ours: NaN, Infinity, `true`, a negative, a string or a list
where a number is expected were converted blindly (`int(NaN)` raised ValueError in the
daemon's start and in `check`, `true` counted as 1). A value of the wrong kind is now a
BadModelValue naming the key, the value and what is accepted; the caller names the file and
says it as it says an unreadable config.json (check: a row; the daemon: the figure unknown).
An absent key or a JSON null is "not given", as transformers reads it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

SHOWN = 80  # characters of a bad value quoted in the message


class BadModelValue(Exception):
    """A key of a model's config.json holds a value of the wrong kind."""

    def __init__(self, key: str, value: object, accepted: str) -> None:
        super().__init__(f"{key} = {shown(value)}: expected {accepted}")
        self.key, self.value, self.accepted = key, value, accepted

    def text(self, file: str) -> str:
        """The problem, naming the file it is in."""
        return f"{file}: {self}"


def shown(value: object) -> str:
    """A value as JSON writes it (NaN, Infinity, true), cut to SHOWN characters."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):  # not a JSON value (an override built in Python)
        text = repr(value)
    return text if len(text) <= SHOWN else text[:SHOWN - 3] + "..."


def count(cfg: Mapping[str, object], key: str, where: str = "") -> int | None:
    """A positive whole number (4096, or 4096.0); None when absent or null."""
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and (not math.isfinite(value) or not value.is_integer())
    ) or value <= 0:
        raise BadModelValue(where + key, value, "a positive whole number")
    return int(value)


def factor(cfg: Mapping[str, object], key: str, where: str = "") -> float | None:
    """A finite positive number; None when absent or null."""
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise BadModelValue(where + key, value, "a finite positive number")
    return float(value)


def string(cfg: Mapping[str, object], key: str, where: str = "") -> str | None:
    """A string; None when absent or null."""
    value = cfg.get(key)
    if value is None or isinstance(value, str):
        return value
    raise BadModelValue(where + key, value, "a string")


def strings(cfg: Mapping[str, object], key: str, where: str = "") -> list[str] | None:
    """A list of strings; None when absent or null."""
    value = cfg.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadModelValue(where + key, value, "a list of strings")
    return value


def table(cfg: Mapping[str, object], key: str, where: str = "") -> dict[str, object] | None:
    """A JSON object; None when absent or null."""
    value = cfg.get(key)
    if value is None or isinstance(value, dict):
        return value
    raise BadModelValue(where + key, value, "a JSON object")
