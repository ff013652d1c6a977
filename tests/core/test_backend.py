"""The attention backend and FlashAttention version the kernel step warms (prewarm/backend.py)."""

from __future__ import annotations

import itertools

import pytest

from vllmwatch.prewarm import backend, kernels

V026 = (0, 26, 0)
V014 = (0, 14, 1)
HOPPER, AMPERE, ADA, BLACKWELL, TURING = (9, 0), (8, 0), (8, 9), (10, 0), (7, 5)


@pytest.mark.parametrize(("cc", "head_dim", "dtype", "version", "args", "env", "want"), [
    # vLLM 0.26 defaults: FA3 on Hopper, FA2 on Ampere/Ada, FlashInfer first on Blackwell.
    (HOPPER, 128, "bfloat16", V026, {}, {}, ("FLASH_ATTN", 3)),
    (HOPPER, 64, "float16", V026, {}, {}, ("FLASH_ATTN", 3)),
    (AMPERE, 128, "bfloat16", V026, {}, {}, ("FLASH_ATTN", 2)),
    (ADA, 128, "bfloat16", V026, {}, {}, ("FLASH_ATTN", 2)),
    (BLACKWELL, 128, "bfloat16", V026, {}, {}, ("FLASHINFER", None)),
    (BLACKWELL, 80, "bfloat16", V026, {}, {}, ("FLASH_ATTN", 4)),
    # Shapes and dtypes FA cannot take.
    (TURING, 128, "float16", V026, {}, {}, ("FLASHINFER", None)),
    (TURING, 96, "float16", V026, {}, {}, ("TRITON_ATTN", None)),
    (HOPPER, 128, "float32", V026, {}, {}, ("TRITON_ATTN", None)),
    (HOPPER, 512, "bfloat16", V026, {}, {}, ("FLASHINFER", None)),
    (HOPPER, 100, "bfloat16", V026, {}, {}, ("TRITON_ATTN", None)),
    # Overrides through [vllm.args].
    (HOPPER, 128, "bfloat16", V026, {"attention-backend": "FLASHINFER"}, {},
     ("FLASHINFER", None)),
    (HOPPER, 128, "bfloat16", V026, {"attention-backend": "auto"}, {}, ("FLASH_ATTN", 3)),
    (HOPPER, 128, "bfloat16", V026, {"attention-config": '{"flash_attn_version": 2}'}, {},
     ("FLASH_ATTN", 2)),
    (HOPPER, 128, "bfloat16", V026, {"attention-config": {"backend": "triton_attn"}}, {},
     ("TRITON_ATTN", None)),
    (HOPPER, 128, "bfloat16", V026, {"attention-config.flash_attn_version": 2}, {},
     ("FLASH_ATTN", 2)),
    (HOPPER, 128, "bfloat16", V026, {"attention_config": "not json"}, {}, ("FLASH_ATTN", 3)),
    # Forced fallbacks after an override.
    (BLACKWELL, 128, "bfloat16", V026,
     {"attention-backend": "FLASH_ATTN", "attention-config.flash_attn_version": "3"}, {},
     ("FLASH_ATTN", 4)),
    (AMPERE, 128, "bfloat16", V026, {"attention-config.flash_attn_version": 3}, {},
     ("FLASH_ATTN", 2)),
    (HOPPER, 384, "bfloat16", V026, {"attention-backend": "FLASH_ATTN"}, {},
     ("FLASH_ATTN", 4)),
    # The variables count only before 0.15 (0.26 ignores them) or when the version is unknown.
    (HOPPER, 128, "bfloat16", V026, {}, {"VLLM_ATTENTION_BACKEND": "FLASHINFER"},
     ("FLASH_ATTN", 3)),
    (HOPPER, 128, "bfloat16", V014, {}, {"VLLM_ATTENTION_BACKEND": "FLASHINFER"},
     ("FLASHINFER", None)),
    (HOPPER, 128, "bfloat16", V014, {}, {"VLLM_ATTENTION_BACKEND": "FLASH_ATTN_VLLM_V1",
                                         "VLLM_FLASH_ATTN_VERSION": "2"}, ("FLASH_ATTN", 2)),
    (HOPPER, 128, "bfloat16", None, {}, {"VLLM_FLASH_ATTN_VERSION": "2"}, ("FLASH_ATTN", 2)),
    (HOPPER, 128, "bfloat16", V026, {}, {"VLLM_FLASH_ATTN_VERSION": "2"}, ("FLASH_ATTN", 3)),
    # The argument beats the variable.
    (HOPPER, 128, "bfloat16", V014, {"attention-backend": "TRITON_ATTN"},
     {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}, ("TRITON_ATTN", None)),
    (None, 128, "bfloat16", V026, {}, {}, ("NONE", None)),
])
def test_choose_matches_vllm(cc: tuple[int, int] | None, head_dim: int, dtype: str,
                             version: tuple[int, ...] | None, args: dict[str, object],
                             env: dict[str, str], want: tuple[str, int | None]) -> None:
    got = backend.choose(cc, head_dim, dtype, version, args, env)
    assert (got.backend, got.fa_version) == want, got.reason
    assert got.reason


@pytest.mark.parametrize(("text", "want"), [
    ("0.26.0", (0, 26, 0)), ("0.26.0+cu130", (0, 26, 0)), ("0.11.0rc2", (0, 11, 0)),
    ("1.2", (1, 2)), ("", None), (None, None), ("dev", None),
])
def test_parse_version(text: str | None, want: tuple[int, ...] | None) -> None:
    assert backend.parse_version(text) == want


def test_a_choice_is_always_runnable() -> None:
    """Over a grid of GPUs, shapes, dtypes and overrides: FLASH_ATTN always comes with a
    version that GPU has; other backends never carry one."""
    overrides: list[dict[str, object]] = [
        {}, {"attention-backend": "FLASH_ATTN"}, {"attention-config.flash_attn_version": 3},
        {"attention-config.flash_attn_version": 4}, {"attention-config.flash_attn_version": 2}]
    grid = itertools.product([(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)],
                             range(8, 600, 8), ["float16", "bfloat16", "float32"], overrides)
    for cc, head_dim, dtype, args in grid:
        got = backend.choose(cc, head_dim, dtype, V026, args, {})
        if got.backend == "FLASH_ATTN":
            assert got.fa_version in (2, 3, 4), (cc, head_dim, args)
            assert got.fa_version == 2 or cc[0] >= 9, (cc, head_dim, args)
            assert got.fa_version != 3 or (cc[0] == 9 and head_dim <= 256), (cc, head_dim)
        else:
            assert got.fa_version is None


def test_plan_gives_the_script_fa3_on_hopper() -> None:
    spec = {"head_dim": 128, "num_heads": 32, "num_kv_heads": 8, "dtype": "bfloat16"}
    out = kernels.plan(spec, {}, {}, "0.26.0", HOPPER)
    assert (out["backend"], out["fa_version"], out["vllm_backend"]) == ("flash_attn", 3,
                                                                         "FLASH_ATTN")
    blackwell = kernels.plan(spec, {}, {}, "0.26.0", BLACKWELL)
    assert (blackwell["backend"], blackwell["fa_version"]) == ("flashinfer", None)
    unknown_gpu = kernels.plan(spec, {}, {"attention-backend": "TRITON_ATTN"}, None, None)
    assert unknown_gpu["backend"] == "triton"
    assert kernels.plan(spec, {}, {}, None, None)["backend"] == "auto"


def test_the_kernel_step_is_off_by_default() -> None:
    """On an H200 it cost ~13 s before each start and won nothing (docs/GPU.md)."""
    from vllmwatch.config.schema import PrewarmConfig

    assert PrewarmConfig().kernels is False
