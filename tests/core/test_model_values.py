"""The figures read from a model's config.json (config/modellen.py, modellen, spareargs):
a value of the wrong kind is a BadModelValue naming the key, the value and what is accepted,
never a ValueError, an OverflowError or a TypeError from deep inside (`int(NaN)` crashed the
daemon's start and `check`; `true` counted as 1), and any JSON in the keys read raises
nothing else."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllmwatch.config.modellen import LEN_KEYS, BadModelValue, model_max_len
from vllmwatch.config.spareargs import kv_bytes_per_token

NAN, INF = float("nan"), float("inf")

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5)
    | st.floats(allow_nan=True, allow_infinity=True),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=6)
ROPE_KEYS = ("rope_type", "type", "factor", "original_max_position_embeddings",
             "full_attention")
KV_KEYS = ("layer_types", "torch_dtype", "dtype", "num_hidden_layers", "kv_lora_rank",
           "qk_rope_head_dim", "num_attention_heads", "num_key_value_heads", "hidden_size",
           "head_dim")
# A value: any JSON, a plausible one (so that the readers get past the first key), or a rope
# table of any JSON in its keys.
VALUE = st.one_of(JSON, st.integers(1, 1 << 20), st.sampled_from(["yarn", "dynamic", "bfloat16"]),
                  st.dictionaries(st.sampled_from(ROPE_KEYS),
                                  st.one_of(JSON, st.sampled_from(["yarn", "dynamic"]),
                                            st.floats(0.5, 8.0)), max_size=4))
CONFIG = st.dictionaries(
    st.sampled_from((*LEN_KEYS, *KV_KEYS, "rope_scaling", "rope_parameters")), VALUE,
    max_size=8)
MODEL = CONFIG | st.builds(lambda inner, top: {**top, "text_config": inner}, CONFIG, CONFIG)


@settings(max_examples=400, deadline=None)
@given(MODEL)
def test_any_json_in_the_keys_read_gives_a_figure_or_a_named_problem(cfg: dict[str, Any]
                                                                      ) -> None:
    for read in (model_max_len, kv_bytes_per_token):
        try:
            got = read(cfg)
        except BadModelValue as exc:
            assert exc.key.split(".")[-1] in (*LEN_KEYS, *KV_KEYS, *ROPE_KEYS, "rope_scaling",
                                              "rope_parameters")
            assert "expected" in str(exc) and exc.accepted in str(exc)
            continue
        if read is model_max_len and got is not None:
            assert isinstance(got, tuple) and isinstance(got[0], int) and got[0] >= 0
        elif read is kv_bytes_per_token and got is not None:
            assert isinstance(got, int) and got > 0


@pytest.mark.parametrize(("value", "shown"), [
    (NAN, "NaN"), (INF, "Infinity"), (-INF, "-Infinity"), (True, "true"), (-1, "-1"),
    (0, "0"), ("4096", '"4096"'), ([4096], "[4096]"), (4096.5, "4096.5"), ({}, "{}")])
def test_a_length_of_the_wrong_kind_is_named(value: object, shown: str) -> None:
    with pytest.raises(BadModelValue) as got:
        model_max_len({"max_position_embeddings": value})
    assert str(got.value) == f"max_position_embeddings = {shown}: expected a positive whole " \
                             "number"
    assert got.value.text("/m/config.json").startswith("/m/config.json: max_position_")


@pytest.mark.parametrize("factor", [NAN, INF, True, -2.0, 0, "4", [4.0]])
def test_a_rope_factor_of_the_wrong_kind_is_named(factor: object) -> None:
    cfg = {"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "dynamic",
                                                              "factor": factor}}
    with pytest.raises(BadModelValue, match=r"^rope_scaling\.factor = .*: expected a finite "
                                            "positive number"):
        model_max_len(cfg)


def test_a_factor_whose_product_overflows_is_named_not_an_overflow_error() -> None:
    cfg = {"max_position_embeddings": 10**400, "rope_scaling": {"type": "dynamic",
                                                                 "factor": 2.0}}
    with pytest.raises(BadModelValue, match="overflows"):
        model_max_len(cfg)
    cfg = {"max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic",
                                                              "factor": 1e308}}
    with pytest.raises(BadModelValue, match="overflows"):
        model_max_len(cfg)


def test_null_is_not_given_and_whole_floats_count() -> None:
    assert model_max_len({"max_position_embeddings": None}) is None
    assert model_max_len({"max_position_embeddings": 4096.0, "seq_length": None}) == (
        4096, "max_position_embeddings 4096")
    nested = {"text_config": {"max_position_embeddings": NAN}}
    with pytest.raises(BadModelValue, match=r"^text_config\.max_position_embeddings = NaN"):
        model_max_len(nested)


@pytest.mark.parametrize(("key", "value"), [
    ("num_hidden_layers", True), ("num_hidden_layers", NAN), ("num_key_value_heads", -8),
    ("head_dim", "128"), ("layer_types", "full_attention"), ("layer_types", [1]),
    ("torch_dtype", ["bfloat16"]), ("hidden_size", INF)])
def test_kv_figures_of_the_wrong_kind_are_named(key: str, value: object) -> None:
    cfg = {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
           "hidden_size": 4096, key: value}
    with pytest.raises(BadModelValue, match=rf"^{key} = "):
        kv_bytes_per_token(cfg)
    kv_bytes_per_token({**cfg, key: None})  # null: not given, no problem
