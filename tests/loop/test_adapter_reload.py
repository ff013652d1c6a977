"""A SIGHUP that adds, removes or repoints [[adapters]] (issue 38): live through vLLM's
load/unload endpoints where the running vLLM can take it, else a planned restart; the log
says which (config.reloaded adapters_added=... removed=... how=live|restart)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tests.support.tinylora import make
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.core.events import ChildExited, ReloadRequested, RestartRequested, Tick
from vllmwatch.core.lora import decide
from vllmwatch.core.state import S
from vllmwatch.testing.driver import Driver

BASE: dict[str, Any] = {
    "vllm": {"model": "/m", "gpus": []},
    "probe": {"interval": 5, "canary_interval": 60, "metrics_interval": 15},
    "restart": {"backoff_jitter": 0.0, "drain_timeout": 30},
    "prewarm": {"enabled": False},
    "drain": {"deregister_delay": 0},
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("adapters")
    return {name: str(make(root / name, rank=r)) for name, r in
            (("a", 8), ("b", 8), ("a2", 8), ("wide", 32))}


def config(dirs: dict[str, str], names: dict[str, str], **lora: Any) -> Config:
    """A config with these adapters (name -> dir key) and [lora] settings."""
    data = {**BASE, "adapters": [{"name": n, "path": dirs[k]} for n, k in names.items()]}
    return from_dict({**data, "lora": lora} if lora else data)


def up(c: Config) -> Driver:
    d = Driver(c)
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    return d


def reloaded(d: Driver) -> dict[str, Any]:
    return d.events("config.reloaded")[-1]


def restarts(d: Driver) -> list[str]:
    return [f["reason"] for f in d.events("restart.begin")]


def test_live_add_of_the_same_rank_loads_without_a_restart(dirs: dict[str, str]) -> None:
    d = up(config(dirs, {"a": "a"}, live=True, max_loras=4))
    pid = d.state.pid
    d.send(ReloadRequested(config(dirs, {"a": "a", "b": "b"}, live=True, max_loras=4)))
    fields = reloaded(d)
    assert (fields["how"], fields["adapters_added"], fields["adapters_removed"]) == (
        "live", ["b"], [])
    assert fields["restart_needed"] is False and restarts(d) == [] and d.state.pid == pid
    [update] = d.fx.adapter_updates
    assert [a.name for a in update.load] == ["b"] and update.unload == () == update.inplace


def test_live_remove_and_repoint_unload_and_load_in_place(dirs: dict[str, str]) -> None:
    d = up(config(dirs, {"a": "a", "b": "b"}, live=True, max_loras=4))
    d.send(ReloadRequested(config(dirs, {"a": "a2"}, live=True, max_loras=4)))
    fields = reloaded(d)
    assert (fields["how"], fields["adapters_removed"], fields["adapters_repointed"]) == (
        "live", ["b"], ["a"])
    [update] = d.fx.adapter_updates
    assert update.unload == ("b",) and update.inplace == ("a",)
    assert [(a.name, a.path) for a in update.load] == [("a", dirs["a2"])]
    assert restarts(d) == []


@pytest.mark.parametrize(("before", "after", "lora", "why"), [
    ({}, {"a": "a"}, {"live": True}, "the first adapter"),
    ({"a": "a"}, {"a": "a", "b": "b"}, {}, "lora.live = false"),
    ({"a": "a"}, {"a": "a", "w": "wide"}, {"live": True, "max_loras": 4}, "max-lora-rank 32"),
    ({"a": "a"}, {"a": "a", "b": "b"}, {"live": True}, "above --max-loras 1"),
])
def test_what_live_cannot_take_is_a_planned_restart(dirs: dict[str, str], before: dict[str, str],
                                                    after: dict[str, str], lora: dict[str, Any],
                                                    why: str) -> None:
    d = up(config(dirs, before, **lora))
    d.send(ReloadRequested(config(dirs, after, **lora)))
    fields = reloaded(d)
    assert fields["how"] == "restart" and why in fields["adapters_why"], fields
    assert restarts(d) == ["reload"] and d.fx.adapter_updates == []
    begin = d.events("restart.begin")[-1]
    assert "adapters changed" in str(begin), begin
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    assert d.world.spawns == 2


def test_a_change_of_lora_settings_restarts(dirs: dict[str, str]) -> None:
    d = up(config(dirs, {"a": "a"}, live=True))
    d.send(ReloadRequested(config(dirs, {"a": "a"}, live=True, max_loras=8)))
    assert reloaded(d)["how"] == "restart" and restarts(d) == ["reload"]


def test_sighup_during_a_restart_adds_no_second_one_and_the_next_launch_has_them(
        dirs: dict[str, str]) -> None:
    d = up(config(dirs, {"a": "a"}, live=True, max_loras=4))
    d.world.ignore_sigterm = True  # the planned restart's stop takes until stop_timeout
    d.send(RestartRequested())
    assert d.state.state in (S.DRAINING, S.STOPPING)
    new = config(dirs, {"a": "a", "b": "b"}, live=True, max_loras=4)
    d.send(ReloadRequested(new))
    fields = reloaded(d)
    assert fields["how"] == "restart" and "not READY" in fields["adapters_why"]
    assert d.fx.adapter_updates == [] and restarts(d) == ["manual"]
    assert d.run_until(lambda: d.state.state == S.READY, 300)
    assert d.world.spawns == 2 and d.state.config.adapters == new.adapters  # the launch's


def test_sighup_during_a_start_restarts_it_with_the_new_adapters(dirs: dict[str, str]) -> None:
    d = up(config(dirs, {"a": "a"}, live=True, max_loras=4))
    d.kill_child(code=None, signal="SIGKILL")  # the crash's relaunch is starting
    assert d.state.state == S.STARTING
    d.send(ReloadRequested(config(dirs, {"a": "a", "b": "b"}, live=True, max_loras=4)))
    assert reloaded(d)["how"] == "restart" and restarts(d)[-1] == "reload"
    assert d.fx.adapter_updates == []
    assert d.run_until(lambda: d.state.state == S.READY, 300)


def test_nothing_of_the_adapters_changed_says_nothing(dirs: dict[str, str]) -> None:
    c = config(dirs, {"a": "a"}, live=True)
    d = up(c)
    d.send(ReloadRequested(dataclasses.replace(c, probe=dataclasses.replace(c.probe,
                                                                            interval=1))))
    assert "how" not in reloaded(d) and restarts(d) == []
    assert decide(c, c, True).how == "none"
    bare = from_dict(BASE)  # no adapters: [lora] alone changes no launch
    assert decide(bare, from_dict({**BASE, "lora": {"live": True}}), True).how == "none"


def test_a_rank_change_in_place_is_a_repoint(dirs: dict[str, str], tmp_path: Path) -> None:
    old = config(dirs, {"a": "a"}, live=True, max_loras=2, max_lora_rank=64)
    make(tmp_path / "x", rank=16)
    new = from_dict({**BASE, "adapters": [{"name": "a", "path": str(tmp_path / "x")}],
                     "lora": {"live": True, "max_loras": 2, "max_lora_rank": 64}})
    change = decide(old, new, True)
    assert (change.how, change.repointed) == ("live", ("a",))


def test_each_adapter_answers_before_ready_and_only_a_required_one_holds_it(
        dirs: dict[str, str]) -> None:
    """An adapter's check is smoke's: one 1-token completion under its name, before READY,
    with the adapter's `required`; [[smoke]] checks come after the adapters'."""
    data = {**BASE, "adapters": [{"name": "a", "path": dirs["a"]},
                                 {"name": "b", "path": dirs["b"], "required": False}],
            "smoke": [{"endpoint": "chat"}]}
    d = Driver(from_dict(data))
    d.world.smoke_errors["adapter:b"] = "HTTP 404: The model `b` does not exist."
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    assert d.world.smoke_sent == ["adapter:a", "adapter:b", "chat"]
    d2 = Driver(from_dict(data))
    d2.world.smoke_errors["adapter:a"] = "HTTP 404: The model `a` does not exist."
    assert not d2.run_until(lambda: d2.state.state == S.READY, 60)
    assert d2.world.smoke_sent == ["adapter:a"]  # held: nothing more is sent


REFUSED = ("(APIServer pid=1) ValueError: Call to add_lora method failed: Worker failed with "
           "error 'Adapter bias is not supported.', please check the stack trace above for "
           "the root cause", "resource_tracker: There appear to be 1 leaked semaphore")


def _refused_at_start(d: Driver) -> None:
    assert d.run_until(lambda: d.state.state == S.STARTING and d.world.child_alive, 60)
    d.world.child_alive = False
    d.fx.exited = ChildExited(d.world.next_pid - 1, 1, None, last_lines=REFUSED)
    d.send(Tick())


def test_vllm_refusing_an_optional_adapter_at_start_relaunches_without_it(
        dirs: dict[str, str]) -> None:
    data = {**BASE, "adapters": [{"name": "a", "path": dirs["a"]},
                                 {"name": "b", "path": dirs["b"], "required": False}]}
    d = Driver(from_dict(data))
    d.world.health_ok = False  # the first start does not get far: vLLM exits
    _refused_at_start(d)
    [said] = d.events("lora.start_refused")
    assert said["left_out"] == ["b"] and "Adapter bias is not supported." in said["error"]
    d.world.health_ok = True
    assert d.run_until(lambda: d.state.state == S.READY, 300)
    assert [a.name for a in d.state.config.adapters] == ["a"]  # what the relaunch carried
    # a SIGHUP with the file as it is brings it back (added: here a restart, live = false)
    d.send(ReloadRequested(from_dict(data)))
    assert reloaded(d)["adapters_added"] == ["b"]


def test_vllm_refusing_a_required_adapter_at_start_fails_the_start(dirs: dict[str, str]) -> None:
    d = Driver(config(dirs, {"a": "a"}))
    d.world.health_ok = False
    _refused_at_start(d)
    [said] = d.events("lora.start_refused")
    assert said["left_out"] == [] and "every adapter is required" in said["detail"]
    assert [a.name for a in d.state.config.adapters] == ["a"]
    assert restarts(d) == ["crash"]


@pytest.mark.parametrize("live", [True, False])
def test_changing_only_required_restarts_nothing_and_loads_nothing(dirs: dict[str, str],
                                                                  live: bool) -> None:
    """`required` is the smoke check's (READY waits for the adapter or not); nothing vLLM is
    launched or loaded with: before, it counted as a repoint (a drained restart with
    live = false, a needless load in place with true)."""
    c = config(dirs, {"a": "a"}, live=live)
    d = up(c)
    flipped = dataclasses.replace(c, adapters=tuple(dataclasses.replace(a, required=False)
                                                    for a in c.adapters))
    d.send(ReloadRequested(flipped))
    assert restarts(d) == [] and d.fx.adapter_updates == [], reloaded(d)
    assert d.state.config.adapters[0].required is False
