"""A spare turned back on by a reload is built only beside an engine launched with its room
(hostile review of the spare's lifecycle): with `spare.enabled = false` the serving engine
is relaunched at the operator's own setting (0.90); a reload to `true` then planned a spare
that cannot fit beside it, and each build failed until spare.retries turned it off. The
build is deferred, not failed, until the engine's next launch takes the lowered setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.models import spare_config
from vllmwatch.core.events import Event
from vllmwatch.core.failover import SpareBuilt
from vllmwatch.shell import sparefx
from vllmwatch.shell.memory import make_sampler
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml
from vllmwatch.testing.world import LogCapture

ARGV = ("vllm", "serve", "m", "--gpu-memory-utilization", "0.90")


def test_a_spare_turned_on_again_waits_for_a_launch_with_its_room(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    on = spare_config(tmp_path)
    off = spare_config(tmp_path, spare={"enabled": "false"})
    sampler = make_sampler([0], LogCapture(), nvml=FakeNvml([FakeGpu(total_mib=143771.0)]))
    fx = sparefx.make(on, {"STATE_DIRECTORY": str(tmp_path / "state")}, sampler, False,
                      LogCapture())
    assert fx is not None
    posted: list[Event] = []
    assert fx._prepare(on, posted.append, 1) and not posted  # the first build: no launch yet
    lowered = fx.serving_argv(ARGV, on, launch=True)
    assert lowered != list(ARGV), "the plan lowers the serving engine for the spare"
    assert fx._prepare(on, posted.append, 2) and not posted  # beside it: it fits

    # spare.enabled = false by a reload, then a fault: the relaunch takes the full setting
    assert fx.serving_argv(ARGV, off, launch=True) == list(ARGV)
    fx.serving_argv(ARGV, on)  # the standby's next command is not a launch: nothing moves
    assert not fx._prepare(on, posted.append, 3)  # a reload turned it on again
    assert len(posted) == 1 and isinstance(posted[0], SpareBuilt)
    got = posted[0]
    assert got.deferred and not got.ok and got.build == 3, got
    flag = lowered.index("--gpu-memory-utilization")  # what it has, and what it needs
    assert "the operator's setting" in got.detail, got.detail
    assert f"--gpu-memory-utilization {lowered[flag + 1]}" in got.detail, got.detail
    assert "next launch" in got.detail and "SIGUSR1" in got.detail, got.detail
    # the next launch takes the lowered setting: the build after it goes ahead
    assert fx.serving_argv(ARGV, on, launch=True) == lowered
    assert fx._prepare(on, posted.append, 4) and len(posted) == 1


@pytest.mark.parametrize("flags,on,said", [
    (None, True, "not checked: whether the installed vLLM has sleep mode"),
    ({"enable-sleep-mode", "uds"}, True, ""),
    ({"uds"}, False, "no --enable-sleep-mode"),
    ({"enable-sleep-mode"}, False, "no --uds"),
], ids=["not-cached", "both", "no-sleep-mode", "no-uds"])
def test_the_daemons_plan_reads_vllms_cached_flags(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: set[str] | None, on: bool,
        said: str) -> None:
    """The daemon's plan never learnt whether vLLM has sleep mode and --uds (only `check`
    did): `auto` went on for a vLLM without sleep mode and every build failed, and `true`
    with a vLLM without --uds would have started a spare on the serving command's --port.
    It reads the flag list that `check` or the first launch cached (never asks vLLM)."""
    from vllmwatch.config import vllmflags, vllminfo
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    asked: list[bool] = []

    def known(command: object, version: object, cache: object, *, ask: bool = True,
              timeout: float = 0.0) -> vllmflags.FlagSet | None:
        asked.append(ask)
        return None if flags is None else vllmflags.FlagSet("0.26.0", frozenset(flags),
                                                           frozenset())
    monkeypatch.setattr(vllminfo, "version", lambda command: "0.26.0")
    monkeypatch.setattr(vllmflags, "known_flags", known)
    log = LogCapture()
    sampler = make_sampler([0], log, nvml=FakeNvml([FakeGpu(total_mib=143771.0)]))
    fx = sparefx.make(spare_config(tmp_path), {"STATE_DIRECTORY": str(tmp_path / "state")},
                      sampler, False, log)
    assert asked == [False], "the start asked vLLM (or never looked at the cache)"
    plan = log.named("spare.plan")[-1]
    assert (fx is not None) == on == plan["on"], plan
    text = f"{plan['reason']} {plan.get('todo', '')} {plan['lines']}"
    assert said in text if said else "not checked" not in text, text
