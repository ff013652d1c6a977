"""A model's config.json as vllmwatch reads it: its own context length, as vLLM reads it
(rope scaling included): `vllmwatch check` (max-model-len, the spare's plan) and the daemon's
spare plan share it, so both say the same; and each value read there checked for its kind.

The values vllmwatch reads from a model's config.json (its context length, its KV cache
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

from vllmwatch.config.redact import REDACT

__all__ = ["LEN_KEYS", "BadModelValue", "model_max_len"]

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
    return REDACT.head(text, SHOWN)  # (a model's file: redacted before the cut, as all text)


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


# The keys vLLM reads for a model's context length; it takes the smallest one present.
LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
            "max_sequence_length", "max_seq_length", "seq_len", "model_max_length")


def model_max_len(cfg: Mapping[str, object]) -> tuple[int, str] | None:
    """The longest context the model config supports (rope scaling included), and why;
    None when it names none. Raises BadModelValue for a key of the wrong kind (NaN, a
    string, `true`, ...: below), and nothing else for any JSON in it."""
    text = cfg.get("text_config")
    where = ""
    if isinstance(text, dict) and not any(cfg.get(k) is not None for k in LEN_KEYS):
        cfg, where = text, "text_config."
    found = {k: got for k in LEN_KEYS if (got := count(cfg, k, where)) is not None}
    if not found:
        return None
    key = min(found, key=lambda k: found[k])
    limit, why = found[key], f"{key} {found[key]}"
    rope_key = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
    rope, where = table(cfg, rope_key, where), f"{where}{rope_key}."
    if rope is not None and isinstance(rope.get("full_attention"), dict):
        rope = table(rope, "full_attention")  # per-layer-type rope parameters
        where += "full_attention."
    if rope:
        kind = string(rope, "rope_type", where) or string(rope, "type", where) or "default"
        if kind not in ("su", "longrope", "llama3", "default"):
            times = factor(rope, "factor", where)
            if times is not None:
                original = count(rope, "original_max_position_embeddings", where) \
                    if kind == "yarn" else None
                if original is not None:
                    limit, why = original, f"original_max_position_embeddings {original}"
                try:
                    scaled = limit * times  # in floats, as vLLM computes it
                except OverflowError:  # a length beyond any float: no product either
                    scaled = math.inf
                if not math.isfinite(scaled):
                    raise BadModelValue(where + "factor", times, "a finite positive number "
                                        f"(x {limit} overflows)")
                limit = int(scaled)
                why += f" x {kind} rope factor {times:g}"
    return limit, why
