"""Model directories for tests that need a model's size and shape but never its weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllmwatch.config.schema import Config, from_dict
from vllmwatch.testing.daemon import PYTHON
from vllmwatch.testing.ports import free_port

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


def spare_config(tmp: Path, **over: Any) -> Config:
    """`[spare] enabled = true` behind the gate over the fake vLLM and a sparse 8B (one per
    `tmp`), GPU 0; `over` is merged over it (e.g. vllm={"gpus": [1]}, adapters=[...])."""
    model = tmp / "model"
    base: dict[str, Any] = {
        "vllm": {"command": [PYTHON, "-m", "vllmwatch.testing.fake_vllm"],
                 "model": str(model) if model.is_dir() else sparse_8b(tmp, 2048),
                 "port": free_port(), "gpus": [0], "args": {"max-model-len": 4096}},
        "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}"},
        "spare": {"enabled": "true"},
        "restart": {"standby": "false"},
    }
    for table, value in over.items():  # one level: a table's keys, or a whole array
        base[table] = {**base.get(table, {}), **value} if isinstance(value, dict) else value
    return from_dict(base, path=str(tmp / "vllmwatch.toml"))
