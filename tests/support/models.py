"""Model directories for tests that need a model's size and shape but never its weights."""

from __future__ import annotations

import json
from pathlib import Path

# An 8B's shape (Qwen3-8B): what the spare's plan reads for its KV bytes per token.
EIGHT_B_CONFIG = {
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
    "hidden_size": 4096, "head_dim": 128, "torch_dtype": "bfloat16",
    "max_position_embeddings": 32768}


def sparse_8b(tmp: Path, weights_mib: int) -> str:
    """A model directory whose weights measure weights_mib (a sparse file: no room in this
    box's memory or disk for an 8B's bytes) and an 8B's config.json."""
    d = tmp / "model"
    d.mkdir()
    with open(d / "model.safetensors", "wb") as fh:
        fh.truncate(weights_mib * 2**20)
    (d / "config.json").write_text(json.dumps(EIGHT_B_CONFIG))
    return str(d)
