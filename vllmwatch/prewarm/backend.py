"""Which attention backend and FlashAttention version the configured vLLM will run. Pure.

Mirrors vLLM's own choice (0.26: platforms/cuda.py `_get_backend_priorities` and
v1/attention/backends/fa_utils.py `get_flash_attn_version`) for dense, non-MLA models, so that
the kernel step warms the kernel vLLM uses: FA3 on Hopper, FA4 on Blackwell where the wheel
has it, FA2 elsewhere; FlashInfer first on Blackwell; Triton where neither fits.
Overrides: `attention-backend` and `attention-config` (a dict or JSON text with `backend` and
`flash_attn_version`, or the dotted `attention-config.flash_attn_version` key) in [vllm.args];
the VLLM_ATTENTION_BACKEND / VLLM_FLASH_ATTN_VERSION variables only before vLLM 0.15, which
removed them (vllm-project/vllm#32812; 0.26 ignores them silently).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

ENV_REMOVED_IN = (0, 15)
HALF = ("float16", "bfloat16")
FLASHINFER_HEAD_SIZES = (64, 128, 256, 512)
# Names vLLM accepts, plus old spellings, -> the enum name vLLM 0.26 uses.
_ALIASES = {"FLASH_ATTN_VLLM_V1": "FLASH_ATTN", "FLASHINFER_VLLM_V1": "FLASHINFER",
            "TRITON_ATTN_VLLM_V1": "TRITON_ATTN", "TRITON": "TRITON_ATTN",
            "FLASH_ATTENTION": "FLASH_ATTN", "SDPA": "TORCH_SDPA"}


@dataclass(frozen=True)
class Choice:
    """The backend vLLM will use (its enum name), the FA version for FLASH_ATTN, and why."""

    backend: str
    fa_version: int | None
    reason: str


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """(0, 26, 0) from "0.26.0", "0.26.0+cu130" or "0.11.0rc2"; None when unreadable."""
    if not text:
        return None
    parts: list[int] = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = ""
        for ch in piece:
            if not (ch.isascii() and ch.isdigit()):
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


def _attention_config(args: Mapping[str, object]) -> dict[str, object]:
    raw = args.get("attention-config", args.get("attention_config"))
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raw = None
    out = dict(raw) if isinstance(raw, Mapping) else {}
    for key, value in args.items():  # --attention-config.flash_attn_version 3
        for prefix in ("attention-config.", "attention_config."):
            if key.startswith(prefix):
                out[key[len(prefix):]] = value
    return out


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:  # as vLLM reads it (int()): '٣' is 3 there; '²' or '3.0' is nothing
            return int(value.strip())
        except ValueError:
            return None
    return None


def requested(args: Mapping[str, object], env: Mapping[str, str],
              version: tuple[int, ...] | None) -> tuple[str | None, int | None]:
    """(backend, fa_version) asked for explicitly, each None when left to vLLM."""
    conf = _attention_config(args)
    env_ok = version is None or version < ENV_REMOVED_IN
    name: object = args.get("attention-backend", args.get("attention_backend"))
    name = name or conf.get("backend") or (env.get("VLLM_ATTENTION_BACKEND") if env_ok else None)
    backend = None
    if isinstance(name, str) and name.strip() and name.strip().lower() != "auto":
        upper = name.strip().upper()
        backend = _ALIASES.get(upper, upper)
    fa = _int(conf.get("flash_attn_version"))
    if fa is None and env_ok:
        fa = _int(env.get("VLLM_FLASH_ATTN_VERSION"))
    return backend, fa


def flash_attn_fits(cc: tuple[int, int], head_dim: int, dtype: str) -> bool:
    """vLLM's FLASH_ATTN validate_configuration for the common case (0.26)."""
    return cc >= (8, 0) and dtype in HALF and head_dim % 8 == 0 and head_dim <= 256


def flashinfer_fits(cc: tuple[int, int], head_dim: int, dtype: str) -> bool:
    """vLLM's FLASHINFER checks: compute capability 7.5+, half dtypes, its head sizes."""
    return cc >= (7, 5) and dtype in HALF and head_dim in FLASHINFER_HEAD_SIZES


def fa_version_for(cc: tuple[int, int], head_dim: int, asked: int | None) -> tuple[int, str]:
    """get_flash_attn_version: platform default, the override, then the forced fallbacks."""
    default = 3 if cc[0] == 9 else 4 if cc[0] == 10 else 2
    version, why = (asked, "flash_attn_version set") if asked else (default, f"sm{cc[0]}x")
    if cc[0] >= 10 and version == 3:
        return 4, "FA3 cannot run on Blackwell"
    if version == 3 and cc[0] == 9 and head_dim > 256:
        return 4, f"FA3 has no head_dim {head_dim}"
    if version in (3, 4) and cc[0] < 9:
        return 2, f"FA{version} needs sm90+"
    return version, why


def choose(cc: tuple[int, int] | None, head_dim: int, dtype: str,
           version: tuple[int, ...] | None, args: Mapping[str, object],
           env: Mapping[str, str]) -> Choice:
    """What vLLM will run for this GPU (compute capability), model shape and configuration."""
    if cc is None:
        return Choice("NONE", None, "no CUDA GPU")
    backend, asked = requested(args, env, version)
    if backend is not None:
        why = "attention backend set in the configuration"
    else:
        order = ["FLASHINFER", "FLASH_ATTN"] if cc[0] == 10 else ["FLASH_ATTN", "FLASHINFER"]
        fits = {"FLASH_ATTN": flash_attn_fits(cc, head_dim, dtype),
                "FLASHINFER": flashinfer_fits(cc, head_dim, dtype)}
        backend = next((b for b in order if fits[b]), "TRITON_ATTN")
        why = f"first that fits sm{cc[0]}{cc[1]}, head_dim {head_dim}, {dtype}"
    if backend != "FLASH_ATTN":
        return Choice(backend, None, why)
    fa, fa_why = fa_version_for(cc, head_dim, asked)
    return Choice(backend, fa, f"{why}; FA{fa}: {fa_why}")
