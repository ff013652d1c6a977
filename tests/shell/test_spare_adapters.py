"""The spare serves what the serving engine serves, LoRA adapters included (issue 38: "every
restart, failover spare included, comes back with them"): its command carries the same
--enable-lora/--lora-modules, and a reload that adds an adapter changes what a spare built
now would run, so the asleep spare is rebuilt with it before it ever serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.models import spare_config
from tests.support.tinylora import make
from vllmwatch.config.schema import Config
from vllmwatch.core.failover import changed
from vllmwatch.shell import sparefx
from vllmwatch.shell.memory import make_sampler
from vllmwatch.shell.sparerun import digest
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml
from vllmwatch.testing.world import LogCapture


def _config(tmp: Path, adapters: list[dict[str, Any]]) -> Config:
    return spare_config(tmp, adapters=adapters)


def _modules(argv: list[str]) -> list[str]:
    """The values after --lora-modules (vLLM takes them space-separated, up to a flag)."""
    if "--lora-modules" not in argv:
        return []
    rest = argv[argv.index("--lora-modules") + 1:]
    end = next((i for i, w in enumerate(rest) if w.startswith("--")), len(rest))
    return rest[:end]


def test_the_spare_carries_the_adapters_and_a_reload_that_adds_one_rebuilds_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    sql, chat = str(make(tmp_path / "sql", rank=8)), str(make(tmp_path / "chat", rank=8))
    one = _config(tmp_path, [{"name": "sql", "path": sql}])
    two = _config(tmp_path, [{"name": "sql", "path": sql}, {"name": "chat", "path": chat}])
    sampler = make_sampler([0], LogCapture(), nvml=FakeNvml([FakeGpu(total_mib=143771.0)]))
    fx = sparefx.make(one, {"STATE_DIRECTORY": str(tmp_path / "state")}, sampler, False,
                      LogCapture())
    assert fx is not None
    argv = list(fx.tree.cmd.argv)
    assert "--enable-lora" in argv and _modules(argv) == [f"sql={sql}"], argv
    built = digest(fx.tree.cmd)
    assert changed(built, fx.inputs(one)) == ""  # nothing changed: no rebuild
    assert changed(built, fx.inputs(two)) != ""  # the added adapter: a rebuild
    fx.use(two)
    assert fx._planner is not None
    rebuilt = list(fx._planner.command(two, fx.plan).argv)
    assert _modules(rebuilt) == [f"sql={sql}", f"chat={chat}"], rebuilt
