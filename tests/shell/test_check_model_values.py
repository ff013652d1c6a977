"""A model config.json whose figures are of the wrong kind (NaN, Infinity, `true`, a string,
a list where a name is expected) is a FAIL row of `vllmwatch check` naming the file, the key,
the value and what is accepted; before, `check` said "max-model-len check crashed: ValueError
... (a vllmwatch bug; please report it)", and the daemon's spare plan, `prewarm` and the
standby read the same file. Any JSON in the keys read gives a row, never an exception."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.test_model_values import MODEL
from tests.shell.test_check import make_model, results, write_config
from vllmwatch.check import maxlen as checks_maxlen
from vllmwatch.check import model as checks_model
from vllmwatch.check import runner as check
from vllmwatch.check.runner import FAIL, PASS
from vllmwatch.config.schema import from_dict
from vllmwatch.config.spare import SpareFacts
from vllmwatch.prewarm import kernels
from vllmwatch.shell import sparefx, standby_main


@pytest.mark.parametrize(("extra", "key", "shown"), [
    ({"max_position_embeddings": float("nan")}, "max_position_embeddings", "NaN"),
    ({"max_position_embeddings": True}, "max_position_embeddings", "true"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": float("inf")}},
     "rope_scaling.factor", "Infinity"),
    ({"seq_length": "8k"}, "seq_length", '"8k"'),
])
def test_a_length_of_the_wrong_kind_fails_max_model_len_naming_it(
        tmp_path: Path, extra: dict[str, Any], key: str, shown: str) -> None:
    model = make_model(tmp_path / "m", **extra)
    row = results(write_config(tmp_path, model), fast=True)["max-model-len"]
    assert row.status == FAIL, row
    assert row.detail.startswith(f"{model / 'config.json'}: {key} = {shown}: expected "), row
    assert "crashed" not in row.detail and "vllmwatch bug" not in row.detail


@pytest.mark.parametrize(("architectures", "shown"), [(5, "5"), ("Qwen3ForCausalLM",
                                                                  '"Qwen3ForCausalLM"'),
                                                      ([["X"]], '[["X"]]')])
def test_architectures_of_the_wrong_kind_fail_model_config(tmp_path: Path, architectures: object,
                                                           shown: str) -> None:
    model = make_model(tmp_path / "m", architectures=architectures)
    row = results(write_config(tmp_path, model), fast=True)["model.config"]
    assert row.status == FAIL, row
    assert row.detail.startswith(f"{model / 'config.json'}: architectures = {shown}: "
                                 "expected a list of strings"), row


def test_the_spare_plan_names_the_problem_and_keeps_the_figures_it_can_read(
        tmp_path: Path) -> None:
    model = make_model(tmp_path / "m", max_position_embeddings=float("nan"),
                       num_hidden_layers=2, num_attention_heads=4, hidden_size=64)
    conf = _conf(model)
    problems: list[str] = []
    weights, per_token, max_len = sparefx.model_figures(conf, {}, "auto", problems)
    assert max_len is None and per_token == 2 * 4 * 16 * 2 * 2 and weights is not None
    assert problems == [f"{model / 'config.json'}: max_position_embeddings = NaN: expected a "
                        "positive whole number"]
    facts = sparefx.model_facts(SpareFacts(), conf, {})
    assert facts.model_problem == problems[0]


def test_prewarm_takes_its_defaults_for_figures_of_the_wrong_kind(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_attention_heads": "32", "hidden_size": 4096}))
    assert kernels.model_shape(tmp_path)["from_config"] is False
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": [1],
                                                      "hidden_size": 8}))
    assert kernels.model_shape(tmp_path)["from_config"] is False


def test_the_standby_skips_architectures_of_the_wrong_kind(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    registry = SimpleNamespace(_VLLM_MODELS={"Qwen3ForCausalLM": ("qwen3", "Qwen3")})
    monkeypatch.setitem(sys.modules, "vllm.model_executor.models.registry", registry)
    for archs in (5, [["x"]], [{"a": 1}, "Qwen3ForCausalLM"]):
        (tmp_path / "config.json").write_text(json.dumps({"architectures": archs}))
        got = standby_main.architecture_modules(str(tmp_path))
        assert got == ([] if archs != [{"a": 1}, "Qwen3ForCausalLM"]
                       else ["vllm.model_executor.models.qwen3"])


def _conf(model: Path) -> Any:
    return from_dict({"vllm": {"model": str(model), "port": 18001, "gpus": [],
                               "command": ["/nonexistent/vllm", "serve"]},
                      "gate": {"enabled": True, "listen": "127.0.0.1:18002"},
                      "spare": {"enabled": "auto"}})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(MODEL, st.sampled_from([None, 5, "X", ["X"], [1]]))
def test_any_json_in_the_keys_read_gives_rows_never_an_exception(cfg: dict[str, Any],
                                                                  archs: object) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp) / "m")
        (model / "config.json").write_text(json.dumps({**cfg, "architectures": archs}))
        conf = _conf(model)
        ctx = check.Context(conf, fast=True, env={})
        rows = [checks_model._check_model_config(model), checks_maxlen.check_max_model_len(ctx)]
        for row in rows:
            assert "crashed" not in row.detail
            if row.status == FAIL:
                assert str(model / "config.json") in row.detail and "expected" in row.detail
        if archs in (None, ["X"]):
            assert rows[0].status == PASS
        problems: list[str] = []
        sparefx.model_figures(conf, {}, "auto", problems)
        assert all(p.startswith(f"{model / 'config.json'}: ") for p in problems)
