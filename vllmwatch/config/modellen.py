"""A model's own context length from its config.json, as vLLM reads it (rope scaling
included): `vllmwatch check` (max-model-len, the spare's plan) and the daemon's spare plan
share it, so both say the same."""

from __future__ import annotations

import math
from collections.abc import Mapping

from vllmwatch.config.modelnums import BadModelValue, count, factor, string, table

__all__ = ["LEN_KEYS", "BadModelValue", "model_max_len"]

# The keys vLLM reads for a model's context length; it takes the smallest one present.
LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
            "max_sequence_length", "max_seq_length", "seq_len", "model_max_length")


def model_max_len(cfg: Mapping[str, object]) -> tuple[int, str] | None:
    """The longest context the model config supports (rope scaling included), and why;
    None when it names none. Raises BadModelValue for a key of the wrong kind (NaN, a
    string, `true`, ...: config/modelnums.py), and nothing else for any JSON in it."""
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
