"""Pure helpers of the spare's plan (config/spare.py): vLLM's number syntax, rounding,
the KV bytes of one token from a model's config.json, and flags set on an argv."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from vllmwatch.config.flags import flag_name
from vllmwatch.config.modellen import count, string, strings


def ceil3(x: float) -> float:
    """Round up to 0.001 (a utilization that must cover a footprint: finer than 0.01, which
    would give away up to 1.4 GiB of an H200)."""
    return math.ceil(round(x * 1000, 6)) / 1000


def floor2(x: float) -> float:
    """Round down to 0.01 (a utilization that must stay under a bound)."""
    return math.floor(round(x * 100, 6)) / 100


def human_int(value: object) -> int | None:
    """vLLM's human_readable_int (8G = 8 GiB, 8g = 8e9, 32k = 32000), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)([kKmMgGtT]?)\s*", str(value))
    if m is None:
        return None
    number, suffix = m.groups()
    try:
        if not suffix:
            return int(float(number))
        if suffix.isupper():  # binary; vLLM refuses decimals with them
            return None if "." in number else int(number) * 2 ** (10 * ("KMGT".index(suffix) + 1))
        return int(float(number) * 10 ** (3 * ("kmgt".index(suffix) + 1)))
    except (OverflowError, ValueError):
        return None


_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def kv_bytes_per_token(model: Mapping[str, object], kv_cache_dtype: str = "auto"
                       ) -> int | None:
    """Bytes of KV cache one token takes on one GPU (TP 1), from a model's config.json:
    layers x kv heads x head dim x 2 (K and V) x dtype bytes; MLA (kv_lora_rank): layers x
    (kv_lora_rank + qk_rope_head_dim) x dtype bytes. None for layouts it does not model
    (sliding-window, linear-attention or Mamba layers) or a config without the figures.
    Raises BadModelValue for a figure of the wrong kind (NaN, `true`, a negative, a string:
    config/modellen.py), and nothing else for any JSON in these keys."""
    text = model.get("text_config")
    nested = isinstance(text, dict) and model.get("num_hidden_layers") is None
    cfg, where = (text, "text_config.") if isinstance(text, dict) and nested else (model, "")
    types = strings(cfg, "layer_types", where)
    if types is not None and any(t != "full_attention" for t in types):
        return None
    if kv_cache_dtype.startswith("fp8"):
        size = 1
    else:
        dtype = string(cfg, "torch_dtype", where) or string(cfg, "dtype", where) \
            or string(model, "torch_dtype") or "bfloat16"
        size = _DTYPE_BYTES.get(dtype if kv_cache_dtype == "auto" else kv_cache_dtype, 2)
    layers = count(cfg, "num_hidden_layers", where)
    if layers is None:
        return None
    rank, rope = count(cfg, "kv_lora_rank", where), count(cfg, "qk_rope_head_dim", where)
    if rank is not None and rope is not None:
        return layers * (rank + rope) * size
    heads = count(cfg, "num_attention_heads", where)
    kv_heads = count(cfg, "num_key_value_heads", where) or heads
    head_dim = count(cfg, "head_dim", where)
    if head_dim is None:
        hidden = count(cfg, "hidden_size", where)
        head_dim = hidden // heads if hidden is not None and heads is not None else None
    if kv_heads is None or not head_dim:
        return None
    return layers * kv_heads * head_dim * 2 * size


def parallel_size(flags: Mapping[str, object]) -> int:
    """TP x PP of the serving command (1 when unset or unreadable: vLLM reports a bad one)."""
    size = 1
    for name in ("tensor-parallel-size", "pipeline-parallel-size"):
        got = human_int(flags.get(name, 1))
        size *= got if got and got > 0 else 1
    return size


def with_flags(argv: Sequence[str], changes: Mapping[str, str | bool | None]) -> list[str]:
    """argv with each flag set to its value (True: a switch; None: removed), replacing
    `--name value`, `--name=value` and the underscore spelling; new flags go at the end."""
    out: list[str] = []
    wanted = {flag_name(k): v for k, v in changes.items()}
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, _ = token[2:].partition("=") if token.startswith("--") else ("", "", "")
        name = flag_name(name)
        if name in wanted:
            takes_value = wanted[name] is not True and not eq
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            i += 2 if takes_value and nxt and not nxt.startswith("--") else 1
            continue
        out.append(token)
        i += 1
    for name, value in wanted.items():
        if value is True:
            out.append(f"--{name}")
        elif value is not None and value is not False:
            out += [f"--{name}", str(value)]
    return out
