"""lora.live opens vLLM's adapter load and unload endpoints on its TCP port (POST
/v1/load_lora_adapter, and the SageMaker routes POST /adapters and DELETE /adapters/NAME that
vLLM 0.32's key middleware does not guard): any local user could load an adapter from a path
vLLM reads. Nothing said so but a line of the docs ("its private port"): `check` warns, and
each launch's lora.launch is a warning that names the routes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tinylora import make
from vllmwatch.check import runner as check
from vllmwatch.check import vllm as checks
from vllmwatch.check.base import WARN
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.shell import childrun
from vllmwatch.testing.driver import LogCapture


def _config(tmp_path: Path, live: bool, adapters: bool = True) -> Config:
    data = {"vllm": {"model": "/m", "served_model_name": "base"}, "lora": {"live": live}}
    if adapters:
        data["adapters"] = [{"name": "sql", "path": str(make(tmp_path / "sql", rank=8))}]
    return from_dict(data)


@pytest.mark.parametrize("live", [True, False])
def test_check_warns_of_what_lora_live_opens(tmp_path: Path, live: bool) -> None:
    rows = checks.check_lora_live(check.Context(_config(tmp_path, live), fast=True, env={}))
    if not live:
        assert rows == []
        return
    [row] = rows
    assert row.status == WARN, row
    for said in ("/adapters", "/v1/load_lora_adapter", "API key", "local user",
                 "lora.live = false"):
        assert said in row.detail, row.detail


def test_no_adapters_no_row(tmp_path: Path) -> None:
    ctx = check.Context(_config(tmp_path, True, adapters=False), fast=True, env={})
    assert checks.check_lora_live(ctx) == []


@pytest.mark.parametrize("live", [True, False])
def test_each_launch_says_it(tmp_path: Path, live: bool) -> None:
    log = LogCapture()
    childrun._say_adapters(_config(tmp_path, live), log)
    [said] = log.named("lora.launch")
    assert said["live"] is live
    assert said["level"] == ("warning" if live else "info"), said
    assert ("/adapters" in said.get("exposed", "")) is live, said
