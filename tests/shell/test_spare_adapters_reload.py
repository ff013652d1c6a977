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

Pairs = tuple[tuple[str, str], ...]  # (adapter name, which of the made paths)


def _pair(tmp: Path, monkeypatch: pytest.MonkeyPatch, live: bool, max_loras: int,
          before: Pairs, after: Pairs) -> tuple[Inputs, Inputs, Config, Config]:
    """The digests the real shell computes for a spare built with `before`'s adapters and
    for `after`'s, and the core's configs (the same [lora]) with each."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp / "state"))
    paths = {n: str(make(tmp / n, rank=8)) for n in ("sql", "chat", "sql2")}
    base = spare_config(tmp, adapters=[{"name": "sql", "path": paths["sql"]}])
    base = dataclasses.replace(base, lora=dataclasses.replace(base.lora, live=live,
                                                              max_loras=max_loras))

    def shell(pairs: Pairs) -> Config:  # the same config but its adapters
        return dataclasses.replace(base, adapters=tuple(
            dataclasses.replace(base.adapters[0], name=n, path=paths[k]) for n, k in pairs))

    def core(pairs: Pairs) -> Config:
        return dataclasses.replace(CONFIG, lora=LoraConfig(live=live, max_loras=max_loras),
                                   adapters=tuple(AdapterConfig(n, paths[k], rank=8)
                                                  for n, k in pairs))

    sampler = make_sampler([0], LogCapture(), nvml=FakeNvml([FakeGpu(total_mib=143771.0)]))
    fx = sparefx.make(shell(before), {"STATE_DIRECTORY": str(tmp / "state")}, sampler, False,
                      LogCapture())
    assert fx is not None
    return digest(fx.tree.cmd), fx.inputs(shell(after)), core(before), core(after)


SQL, CHAT, SQL2 = ("sql", "sql"), ("chat", "chat"), ("sql", "sql2")
LIVE = {  # (lora.max_loras, before, after): changes lora.live applies without a launch
    "added": (4, (SQL,), (SQL, CHAT)), "repointed": (4, (SQL,), (SQL2,)),
    # --max-loras automatic (0): one adapter less moves it, which the digest took for a
    # change of the vLLM command (review of the fix, 2026-12-05)
    "removed, max_loras auto": (0, (SQL, CHAT), (SQL,)),
    "repointed, max_loras auto": (0, (SQL,), (SQL2,)),
}


@pytest.mark.parametrize("case", sorted(LIVE))
def test_a_live_adapter_change_stays_live_and_rebuilds_the_spare_beside_the_engine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    max_loras, before, after = LIVE[case]
    built, now, one, changed = _pair(tmp_path, monkeypatch, True, max_loras, before, after)
    assert dict(built)[COMMAND] == dict(now)[COMMAND]  # only the adapters differ
    assert dict(built)[ADAPTERS] != dict(now)[ADAPTERS]
    m = InputsWorld()
    m.inputs = built
    _ready(m)
    m.s = dataclasses.replace(m.s, config=one)  # READY with `before`, as launched with it
    assert _rung(m) == R.ASLEEP
    pid = m.s.child.pid if m.s.child else None
    mark = len(m.history)
    m._step(ReloadRequested(changed, spare_inputs=now))
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
    built, now, one, changed = _pair(tmp_path, monkeypatch, False, 4, (SQL,), (SQL, CHAT))
    m = InputsWorld()
    m.inputs = built
    _ready(m)
    m.s = dataclasses.replace(m.s, config=one)
    mark = len(m.history)
    m._step(ReloadRequested(changed, spare_inputs=now))
    acts = m.history[mark:]
    said = _logs(acts, "config.reloaded")[0].fields
    assert said["how"] == "restart" and said["restart_needed"] is True, said
    assert _logs(acts, "restart.begin")
    assert not [a for a in acts if isinstance(a, BuildSpare)], "built beside a relaunch"
    assert _rung(m) == R.DOWN
    m.inputs = now
    # The relaunch's READY (the core world runs no adapter smoke, the shell's work: READY
    # without it): the spare is built then, from the new list
    m.s = dataclasses.replace(m.s, config=dataclasses.replace(changed, adapters=()))
    _ready(m)
    assert _rung(m) == R.ASLEEP and m.s.spare is not None
    assert m.s.spare.built_from == now


def test_a_key_rotation_still_relaunches_the_serving_engine_with_the_spare(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapters' part apart changes nothing for the others: a new API key in the spare's
    inputs relaunches the serving engine, whatever the adapters did."""
    built, now, one, changed = _pair(tmp_path, monkeypatch, True, 4, (SQL,), (SQL, CHAT))
    rotated = tuple((p, "f" * 16 if p == "the API key" else d) for p, d in now)
    m = InputsWorld()
    m.inputs = built
    _ready(m)
    m.s = dataclasses.replace(m.s, config=one)
    mark = len(m.history)
    m._step(ReloadRequested(changed, spare_inputs=rotated))
    said = _logs(m.history[mark:], "config.reloaded")[0].fields
    assert said["restart_needed"] is True and _logs(m.history[mark:], "restart.begin")
