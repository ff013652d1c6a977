"""A tiny random LoRA adapter for the tests' tiny Qwen3 model (scripts/make_tiny_model.py),
written by hand: adapter_config.json and adapter_model.safetensors (no peft, no torch, no
download), the two files vLLM's LoRA loader reads (vllm/lora/peft_helper.py: r, lora_alpha
and target_modules are required; bias "none", no DoRA).

The tiny model: hidden 128, 2 layers, 2 heads of 64 (q_proj 128 -> 128), 1 KV head
(v_proj 128 -> 64). The adapter targets q_proj and v_proj of both layers; F32 weights from
a fixed seed, so the same call writes the same bytes.

    python -m tests.support.tinylora OUTDIR [RANK] [SEED]
"""

from __future__ import annotations

import json
import random
import struct
import sys
from pathlib import Path

HIDDEN, LAYERS = 128, 2
OUT = {"q_proj": 128, "v_proj": 64}  # output features of each target module


def tensors(rank: int, seed: int) -> dict[str, tuple[tuple[int, int], list[float]]]:
    """The adapter's weights: name -> (shape, values), in PEFT's key names."""
    rnd = random.Random(seed)
    out: dict[str, tuple[tuple[int, int], list[float]]] = {}
    for layer in range(LAYERS):
        for module, features in OUT.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            for part, shape in (("lora_A", (rank, HIDDEN)), ("lora_B", (features, rank))):
                n = shape[0] * shape[1]
                out[f"{prefix}.{part}.weight"] = (shape, [rnd.gauss(0.0, 0.02)
                                                          for _ in range(n)])
    return out


def safetensors_bytes(weights: dict[str, tuple[tuple[int, int], list[float]]]) -> bytes:
    """The safetensors format: u64 header length, JSON header, then the raw F32 data."""
    header: dict[str, object] = {}
    blobs: list[bytes] = []
    offset = 0
    for name in sorted(weights):
        shape, values = weights[name]
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": list(shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


def make(outdir: Path, rank: int = 8, seed: int = 0, base: str = "tiny") -> Path:
    """Write the adapter into outdir (made if needed); returns outdir."""
    outdir.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
        "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0, "bias": "none",
        "target_modules": sorted(OUT), "fan_in_fan_out": False, "inference_mode": True,
    }
    (outdir / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (outdir / "adapter_model.safetensors").write_bytes(safetensors_bytes(tensors(rank, seed)))
    return outdir


if __name__ == "__main__":
    args = sys.argv[1:]
    make(Path(args[0]), int(args[1]) if len(args) > 1 else 8,
         int(args[2]) if len(args) > 2 else 0)
