"""A model's own context length from its config.json, as vLLM reads it (rope scaling
included): `vllmwatch check` (max-model-len, the spare's plan) and the daemon's spare plan
share it, so both say the same."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The keys vLLM reads for a model's context length; it takes the smallest one present.
LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
            "max_sequence_length", "max_seq_length", "seq_len", "model_max_length")


def model_max_len(cfg: Mapping[str, Any]) -> tuple[int, str] | None:
    """The longest context the model config supports (rope scaling included), and why."""
    text = cfg.get("text_config")
    if isinstance(text, dict) and not any(k in cfg for k in LEN_KEYS):
        cfg = text
    found = {k: int(cfg[k]) for k in LEN_KEYS if isinstance(cfg.get(k), (int, float))}
    if not found:
        return None
    key = min(found, key=lambda k: found[k])
    limit, why = found[key], f"{key} {found[key]}"
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if isinstance(rope, dict) and isinstance(rope.get("full_attention"), dict):
        rope = rope["full_attention"]  # per-layer-type rope parameters
    if isinstance(rope, dict):
        kind = str(rope.get("rope_type", rope.get("type", "default")))
        factor = rope.get("factor")
        if kind not in ("su", "longrope", "llama3", "default") and isinstance(
                factor, (int, float)):
            if kind == "yarn" and isinstance(rope.get("original_max_position_embeddings"), int):
                limit = rope["original_max_position_embeddings"]
                why = f"original_max_position_embeddings {limit}"
            limit = int(limit * factor)
            why += f" x {kind} rope factor {factor:g}"
    return limit, why
