"""`vllmwatch check` reports the spare's plan (issue 34): its footprint, the serving engine's
reduced setting and the host memory it needs, or why it is off and what to change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vllmwatch.check import runner as check
from vllmwatch.check import spare as cs
from vllmwatch.config.schema import from_dict
from vllmwatch.core.unified import MemInfo
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml, NVMLError_DriverNotLoaded
from vllmwatch.testing.tomlfile import write_toml

QWEN3_8B = {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "hidden_size": 4096, "torch_dtype": "bfloat16",
            "max_position_embeddings": 40960}
HOST = MemInfo(total_mib=2_000_000.0, free_mib=1_500_000.0, available_mib=1_800_000.0)
GATE = {"enabled": True, "listen": "127.0.0.1:18000"}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """An 8B-shaped model directory: config.json and 15.9 GiB of (sparse) weights."""
    d = tmp_path / "qwen3-8b"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(QWEN3_8B))
    with open(d / "model.safetensors", "wb") as fh:
        fh.truncate(16282 * 2**20)  # sparse: the size without the disk
    return d


def config(model: Path, spare: dict[str, Any], gate: dict[str, Any] | None = None,
           args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"vllm": {"model": str(model), "port": 18001, "command": ["/nonexistent/vllm",
                                                                    "serve"],
                     "args": args or {}},
            "gate": gate if gate is not None else GATE, "spare": spare}


def rows(data: dict[str, Any], nvml: Any = None, host: MemInfo | None = HOST
         ) -> dict[str, check.CheckResult]:
    nvml = nvml if nvml is not None else FakeNvml([FakeGpu()])
    ctx = check.Context(from_dict(data), fast=True, env={}, nvml=lambda: nvml)
    got = cs.check_spare(ctx, meminfo=lambda: host, serving=lambda _c: False)
    return {r.name: r for r in got}


def test_off_at_the_shipped_defaults_saying_how_to_turn_it_on(model: Path) -> None:
    res = rows(config(model, {}, gate={}))
    assert list(res) == ["spare"] and res["spare"].status == check.PASS
    assert res["spare"].detail.startswith("off: the gate is off")
    assert "set [gate] enabled = true" in res["spare"].detail


def test_auto_beside_090_is_off_and_names_the_value(model: Path) -> None:
    res = rows(config(model, {"enabled": "auto"}))
    assert res["spare"].status == check.PASS
    assert "at most 0.78" in res["spare"].detail and "0.9 -> 0.78" in res["spare"].detail


def test_true_shows_the_footprint_the_reduced_setting_and_the_host_memory(
        model: Path) -> None:
    res = rows(config(model, {"enabled": True}))
    assert list(res) == ["spare", "spare.serving", "spare.host"]
    assert all(r.status == check.PASS for r in res.values())
    head = res["spare"].detail
    assert head.startswith("on (spare.enabled = true): spare 26.9 GiB awake, 2.0 GiB asleep "
                           "(estimated), gpu-memory-utilization 0.192")
    assert "KV 58254 tokens for max-model-len 40960" in head
    assert "not checked: whether the installed vLLM has sleep mode" in head
    assert res["spare.serving"].detail.startswith(
        "serving engine gpu-memory-utilization 0.9 -> 0.78")
    assert res["spare.host"].detail.startswith("host memory: 24.9 GiB for the spare")


@pytest.mark.parametrize(("kw", "status", "words"), [
    ({"host": MemInfo(total_mib=32768.0, free_mib=8000.0, available_mib=20000.0)},
     check.FAIL, "host memory: the spare needs 24.9 GiB"),
    ({"nvml": FakeNvml(init_error=NVMLError_DriverNotLoaded())}, check.WARN,
     "total memory is unknown"),
])
def test_true_that_cannot_be_honoured_fails_or_warns(model: Path, kw: dict[str, Any],
                                                    status: str, words: str) -> None:
    res = rows(config(model, {"enabled": True}), **kw)
    assert list(res) == ["spare"] and res["spare"].status == status
    assert words in res["spare"].detail


def test_a_kv_cache_too_small_for_max_model_len_fails_with_the_size(model: Path) -> None:
    res = rows(config(model, {"enabled": True, "kv_cache": "2GiB"}))
    assert res["spare"].status == check.FAIL
    assert "spare.kv_cache to at least \"6GiB\"" in res["spare"].detail


def test_the_checklist_has_the_spare_row(model: Path, tmp_path: Path) -> None:
    path = tmp_path / "vllmwatch.toml"
    write_toml(path, config(model, {"enabled": "auto"}))
    names = [r.name for r in check.run(str(path), fast=True, env={},
                                       nvml=lambda: FakeNvml([FakeGpu()]))]
    assert "spare" in names


@pytest.mark.parametrize("where", ["path", "hub"])
def test_the_check_and_the_daemon_read_the_same_model_figures(tmp_path: Path, where: str
                                                              ) -> None:
    """`vllmwatch check` and the daemon plan the spare from one reading of the model's files:
    a Hub id already downloaded (found in the child's HF_HOME) and the context length with
    rope scaling (yarn x4 here: 131072, not max_position_embeddings' 40960). Before, the
    daemon read a local path only and max_position_embeddings alone: for a Hub id its plan
    went off for want of the weights' size while the check said on."""
    from vllmwatch.config.spare import SpareFacts
    from vllmwatch.shell import sparefx

    cfg = {**QWEN3_8B, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                        "original_max_position_embeddings": 32768}}
    if where == "hub":
        repo = tmp_path / "hf" / "hub" / "models--org--name"
        d = repo / "snapshots" / "abc123"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text("abc123")
    else:
        d = tmp_path / "model"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cfg))
    with open(d / "model.safetensors", "wb") as fh:
        fh.truncate(16282 * 2**20)
    env = {"HF_HOME": str(tmp_path / "hf")}
    data = config(d, {"enabled": "true"})
    if where == "hub":
        data["vllm"]["model"] = "org/name"
    conf = from_dict(data)
    ctx = check.Context(conf, fast=True, env=env, nvml=lambda: FakeNvml([FakeGpu()]))
    checked = cs._model(ctx, {}, [])
    daemon = sparefx.model_facts(SpareFacts(), conf, env)
    assert checked == (daemon.weights_mib, daemon.kv_bytes_per_token, daemon.model_max_len)
    assert checked == (16282.0, 36 * 2 * 8 * 128 * 2, 131072)


@pytest.mark.parametrize(("enabled", "status"), [(True, check.FAIL), ("auto", check.WARN)])
def test_no_place_for_the_spare_socket_is_said_as_the_daemon_will_say_it(
        model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, enabled: Any,
        status: str) -> None:
    """A state directory too deep for a socket's 107-byte path and a /tmp fallback that
    others may write into: the daemon starts with the spare off (spare.plan on=false, before
    any plan), where `check` passed the plan it would never make. Nothing is made or changed
    by the check."""
    from vllmwatch.shell import sparefx

    deep, loose = tmp_path / ("d" * 120), tmp_path / "loose"
    deep.mkdir()
    loose.mkdir()
    loose.chmod(0o777)  # not ours alone, as another user's /tmp/vllmwatch-<uid> would be
    monkeypatch.setattr(sparefx, "TMP_PLACE", str(loose), raising=False)
    path = str(tmp_path / "vllmwatch.toml")
    ctx = check.Context(from_dict(config(model, {"enabled": enabled}), path=path), fast=True,
                        env={"STATE_DIRECTORY": str(deep)}, nvml=lambda: FakeNvml([FakeGpu()]))
    [row] = cs.check_spare(ctx, meminfo=lambda: HOST, serving=lambda _c: False)
    assert row.status == status, row
    assert row.detail.startswith(f"off when vllmwatch starts (spare.enabled = {enabled}".lower())
    assert f"{deep}/spare/spare-" in row.detail and "over the 107" in row.detail, row
    assert f"{loose}/spare: not a directory of this user's alone" in row.detail, row
    assert "state directory of at most 77 characters" in row.detail, row
    assert not (deep / "spare").exists() and (loose.stat().st_mode & 0o777) == 0o777


def test_a_place_the_daemon_would_make_passes(model: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A state directory not made yet, below one we may create in: the daemon makes it."""
    from vllmwatch.shell import sparefx

    monkeypatch.setattr(sparefx, "TMP_PLACE", str(tmp_path / "nope" / "x"))
    (tmp_path / "nope").write_text("")  # the fallback cannot be had: the state dir must do
    ctx = check.Context(from_dict(config(model, {"enabled": True}),
                                  path=str(tmp_path / "v.toml")), fast=True,
                        env={"STATE_DIRECTORY": str(tmp_path / "state" / "a")},
                        nvml=lambda: FakeNvml([FakeGpu()]))
    got = cs.check_spare(ctx, meminfo=lambda: HOST, serving=lambda _c: False)
    assert [r.status for r in got] == [check.PASS] * 3, got
    assert not (tmp_path / "state").exists()
