"""The max-model-len check of `vllmwatch check`: the configured length against the context
length of the model's config.json, rope scaling and hf-overrides included."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllmwatch.check.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, vllm_flags
from vllmwatch.check.model import hub_snapshot, local_model_dir, read_json
from vllmwatch.config.modellen import BadModelValue, model_max_len
from vllmwatch.config.spareargs import human_int


def parse_len(value: object) -> int | None:
    """vLLM's max-model-len syntax (human_readable_int_or_auto): 4096, "32k" (x1000), "32K"
    (x1024), "1m"; -1/"auto" = None (the model's own). Raises ValueError, saying what is
    accepted, for what vLLM refuses ("abc", "1e5", 0, true): check once called those "not
    set" and passed them."""
    if value in (-1, "-1") or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    got = human_int(value) if isinstance(value, (int, str)) else None
    if got is None or got <= 0:
        raise ValueError(f"{value!r} is not a length vLLM reads (a whole number such as "
                         "8192, 32k = 32000, 32K = 32768, or auto)")
    return got


def _apply_overrides(cfg: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """hf-overrides as vLLM applies them: sub-configs (*_config) merge, other keys replace."""
    out = dict(cfg)
    for key, value in overrides.items():
        if key.endswith("_config") and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _apply_overrides(out[key], value)
        else:
            out[key] = value
    return out


def _find_model_config(ctx: Context) -> Path | None:
    model = ctx.config.vllm.model
    local = local_model_dir(model)
    base = local if local is not None else hub_snapshot(model, ctx.env)
    cfg = base / "config.json" if base is not None and base.is_dir() else None
    return cfg if cfg is not None and cfg.is_file() else None


def check_max_model_len(ctx: Context) -> CheckResult:
    """A max-model-len set in the args fits the model's context (rope scaling included)."""
    flags = vllm_flags(ctx)
    raw = flags.get("max-model-len")
    cfg_path = _find_model_config(ctx)
    if cfg_path is None:
        return CheckResult("max-model-len", SKIP, "the model's config.json is not available "
                           "locally")
    try:
        cfg = read_json(cfg_path)
        overrides = flags.get("hf-overrides")
        if isinstance(overrides, str):
            overrides = json.loads(overrides)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return CheckResult("max-model-len", SKIP, "config.json or hf-overrides is not valid "
                           "JSON (reported above)")
    overridden = isinstance(overrides, dict) and isinstance(cfg, dict)
    if isinstance(overrides, dict) and isinstance(cfg, dict):
        cfg = _apply_overrides(cfg, overrides)
    try:
        found = model_max_len(cfg) if isinstance(cfg, dict) else None
    except BadModelValue as exc:  # NaN, a string, `true`: vLLM cannot use it either
        source = f"{cfg_path} (with vllm.args.hf-overrides)" if overridden else str(cfg_path)
        return CheckResult("max-model-len", FAIL, f"{exc.text(source)}; fix the model's "
                           "config.json (re-download it), or set the key with hf-overrides "
                           "in [vllm.args]")
    if found is None:
        return CheckResult("max-model-len", SKIP, f"{cfg_path} names no context length")
    limit, why = found
    try:
        wanted = parse_len(raw) if raw is not None else None
    except ValueError as exc:
        return CheckResult("max-model-len", FAIL, f"{exc}: vLLM would refuse to start")
    if wanted is None:
        return CheckResult("max-model-len", PASS, f"not set; vLLM uses the model's {limit} "
                           f"({why})")
    if wanted <= limit:
        return CheckResult("max-model-len", PASS, f"{wanted} <= the model's {limit} ({why})")
    allow = ctx.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").lower() in ("1", "true")
    text = (f"max-model-len {wanted} exceeds the model's {limit} ({why}): lower it to <= "
            f"{limit}, or extend the context with hf-overrides = {{ rope_parameters = "
            f"{{ rope_type = \"yarn\", factor = {-(-wanted // limit)}.0, "
            f"original_max_position_embeddings = {limit} }} }} in [vllm.args]")
    if allow:
        return CheckResult("max-model-len", WARN, text + " (allowed by "
                           "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1; output quality may suffer)")
    return CheckResult("max-model-len", FAIL, text)
