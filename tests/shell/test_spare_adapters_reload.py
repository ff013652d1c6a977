"""A live adapter change with the spare on (review of 2026-12-05): the spare's command carries
--lora-modules, so any add, remove or repoint changed its digest, and the reload read that as
a key rotation: the serving engine was relaunched (no failover: the spare was stopped first)
and `config.reloaded` said `not READY` of a READY engine. The adapters are a part of their
own now: a live change stays live on the serving engine, and the asleep spare, which carries
the old list, is rebuilt at once beside it. A change that needs a launch still relaunches,
and the spare is rebuilt at that launch's READY (never two engines starting side by side)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.core.test_core_properties import CONFIG
from tests.core.test_spare_failover import _logs, _ready, _rung
from tests.core.test_spare_inputs import InputsWorld
from tests.support.models import spare_config
from tests.support.tinylora import make
from vllmwatch.config.schema import Config
from vllmwatch.config.sections import AdapterConfig, LoraConfig
from vllmwatch.core.actions import Spawn, UpdateAdapters
from vllmwatch.core.events import ReloadRequested
from vllmwatch.core.failover import ADAPTERS, COMMAND, BuildSpare, Inputs, StopSpare
from vllmwatch.core.failover import Rung as R
from vllmwatch.shell import sparefx
from vllmwatch.shell.memory import make_sampler
from vllmwatch.shell.sparerun import digest
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml
from vllmwatch.testing.world import LogCapture


def _shell(tmp: Path, monkeypatch: pytest.MonkeyPatch, live: bool
           ) -> tuple[Inputs, dict[str, Inputs], dict[str, str]]:
    """The digests the real shell computes: the spare built with adapter `sql`, and what a
    reload to each variant would build (`two`: `chat` added; `moved`: `sql` repointed)."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp / "state"))
    paths = {n: str(make(tmp / n, rank=8)) for n in ("sql", "chat", "sql2")}
    lora = {"live": live, "max_loras": 4}

    base = spare_config(tmp, adapters=[{"name": "sql", "path": paths["sql"]}])
    one = dataclasses.replace(base, lora=dataclasses.replace(base.lora, **lora))

    def cfg(*adapters: tuple[str, str]) -> Config:  # the same config but its adapters
        return dataclasses.replace(one, adapters=tuple(
            dataclasses.replace(one.adapters[0], name=n, path=paths[p]) for n, p in adapters))

    sampler = make_sampler([0], LogCapture(), nvml=FakeNvml([FakeGpu(total_mib=143771.0)]))
    fx = sparefx.make(one, {"STATE_DIRECTORY": str(tmp / "state")}, sampler, False, LogCapture())
    assert fx is not None
    now = {"two": fx.inputs(cfg(("sql", "sql"), ("chat", "chat"))),
           "moved": fx.inputs(cfg(("sql", "sql2")))}
    return digest(fx.tree.cmd), now, paths


def _core(paths: dict[str, str], live: bool, variant: str) -> tuple[Config, Config]:
    lora = LoraConfig(live=live, max_loras=4)
    one = dataclasses.replace(CONFIG, adapters=(AdapterConfig("sql", paths["sql"], rank=8),),
                              lora=lora)
    more = ((AdapterConfig("sql", paths["sql"], rank=8), AdapterConfig("chat", paths["chat"],
                                                                        rank=8))
            if variant == "two" else (AdapterConfig("sql", paths["sql2"], rank=8),))
    return one, dataclasses.replace(one, adapters=more)


@pytest.mark.parametrize("variant", ["two", "moved"])
def test_a_live_adapter_change_stays_live_and_rebuilds_the_spare_beside_the_engine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variant: str) -> None:
    built, now, paths = _shell(tmp_path, monkeypatch, live=True)
    assert dict(built)[COMMAND] == dict(now[variant])[COMMAND]  # only the adapters differ
    assert dict(built)[ADAPTERS] != dict(now[variant])[ADAPTERS]
    one, changed = _core(paths, True, variant)
    m = InputsWorld()
    m.inputs = built
    _ready(m)
    m.s = dataclasses.replace(m.s, config=one)  # READY with `sql`, as launched with it
    assert _rung(m) == R.ASLEEP
    pid = m.s.child.pid if m.s.child else None
    mark = len(m.history)
    m._step(ReloadRequested(changed, spare_inputs=now[variant]))
    acts = m.history[mark:]
    said = _logs(acts, "config.reloaded")[0].fields
    assert said["how"] == "live" and said["restart_needed"] is False, said
    assert [a for a in acts if isinstance(a, UpdateAdapters)]
    assert not _logs(acts, "restart.begin") and not [a for a in acts if isinstance(a, Spawn)]
    assert m.s.child is not None and m.s.child.pid == pid
    # The spare carried the old list: stopped, then built again at once beside the engine
    kinds = [type(a) for a in acts if isinstance(a, (StopSpare, BuildSpare))]
    assert kinds == [StopSpare, BuildSpare], acts
    assert "the adapters changed" in str(_logs(acts, "spare.rebuilt")[0].fields["why"])
    assert _rung(m) == R.BUILDING


def test_an_adapter_change_that_needs_a_launch_relaunches_and_rebuilds_the_spare_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built, now, paths = _shell(tmp_path, monkeypatch, live=False)
    one, changed = _core(paths, False, "two")
    m = InputsWorld()
    m.inputs = built
    _ready(m)
    m.s = dataclasses.replace(m.s, config=one)
    mark = len(m.history)
    m._step(ReloadRequested(changed, spare_inputs=now["two"]))
    acts = m.history[mark:]
    said = _logs(acts, "config.reloaded")[0].fields
    assert said["how"] == "restart" and said["restart_needed"] is True, said
    assert _logs(acts, "restart.begin")
    assert not [a for a in acts if isinstance(a, BuildSpare)], "built beside a relaunch"
    assert _rung(m) == R.DOWN
    m.inputs = now["two"]
    # The relaunch's READY (the core world runs no adapter smoke, the shell's work: READY
    # without it): the spare is built then, from the new list
    m.s = dataclasses.replace(m.s, config=dataclasses.replace(changed, adapters=()))
    _ready(m)
    assert _rung(m) == R.ASLEEP and m.s.spare is not None
    assert m.s.spare.built_from == now["two"]


def test_a_key_rotation_still_relaunches_the_serving_engine_with_the_spare(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapters' part apart changes nothing for the others: a new API key in the spare's
    inputs relaunches the serving engine, whatever the adapters did."""
    built, now, paths = _shell(tmp_path, monkeypatch, live=True)
    one, changed = _core(paths, True, "two")
    rotated = tuple((p, "f" * 16 if p == "the API key" else d) for p, d in now["two"])
    m = InputsWorld()
    m.inputs = built
    _ready(m)
    m.s = dataclasses.replace(m.s, config=one)
    mark = len(m.history)
    m._step(ReloadRequested(changed, spare_inputs=rotated))
    said = _logs(m.history[mark:], "config.reloaded")[0].fields
    assert said["restart_needed"] is True and _logs(m.history[mark:], "restart.begin")
