"""The start-up cache variables reach the launched child (issue 33, shell/effects.py): what
config/startcaches.py decides is in the child's environment, the operator's [vllm.env] value
wins, a vLLM without the variables gets none, and the decision is logged once, as info."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import launching, wait_for
from vllmwatch.config import vllminfo
from vllmwatch.config.schema import from_dict
from vllmwatch.config.startcaches import MEGA, PLAN, STANDALONE, VllmInfo
from vllmwatch.core.events import ChildExited, Spawned, SpawnFailed
from vllmwatch.shell.effects import RealEffects
from vllmwatch.testing.driver import FakeNotifier

# The child prints the variables it got, then exits.
CHILD = [sys.executable, "-c", "import os; print('got', *(f'{k}={os.environ.get(k)}' for k in "
         f"{(PLAN, MEGA, STANDALONE)!r}), flush=True)"]
V026 = VllmInfo("0.26.0", "2.11.0+cu130", frozenset({PLAN, MEGA, STANDALONE}))


Logged = list[tuple[str, str, dict[str, Any]]]


def launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, info: VllmInfo,
           prewarm: dict[str, Any], env: dict[str, str] | None = None,
           environ: dict[str, str] | None = None) -> tuple[str, Logged]:
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    monkeypatch.setattr(vllminfo, "info", lambda _command: info)
    monkeypatch.setattr(vllminfo, "version", lambda _command: info.version)
    config = from_dict({"vllm": {"command": CHILD, "model": "m", "gpus": [], "env": env or {}},
                        "prewarm": {"cache_dir": str(tmp_path / "cache"), "page_cache": False,
                                    **prewarm}})
    logged: Logged = []
    fx = RealEffects(config, lambda lvl, ev, **kw: logged.append((lvl, ev, kw)), FakeNotifier(),
                     {"PATH": "/usr/bin:/bin", "STATE_DIRECTORY": str(tmp_path / "state"),
                      **(environ or {})})
    try:
        got = launching.spawn(fx, config, lambda _e: None)
        if isinstance(got, SpawnFailed):
            return "refused: " + got.error, logged
        assert isinstance(got, Spawned)
        wait_for(fx.child_exit_pending, 20, "the child exits")
        exited = fx.poll_child()
        assert isinstance(exited, ChildExited)
        return " ".join(ln for ln in exited.last_lines if ln.startswith("got")), logged
    finally:
        fx.close()


def test_the_switches_reach_the_child_and_the_decision_is_logged_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, logged = launch(tmp_path, monkeypatch, V026,
                         {"startup_plan": True, "mega_aot_artifact": True})
    assert out == f"got {PLAN}=1 {MEGA}=1 {STANDALONE}=1"
    said = [kw for lvl, ev, kw in logged if ev == "prewarm.start_caches"]
    assert len(said) == 1 and said[0]["env"] == {PLAN: "1", MEGA: "1", STANDALONE: "1"}
    assert not cache_warnings(logged)


def cache_warnings(logged: Logged) -> list[str]:
    """Warnings about the start-up caches (a fake vLLM draws others: its flags unknown)."""
    return [ev for lvl, ev, kw in logged if lvl == "warning"
            and (ev.startswith(("prewarm.", "startup.")) or "cache" in str(kw))]


def test_the_operators_value_wins_at_the_launch(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    out, _ = launch(tmp_path, monkeypatch, V026, {"startup_plan": True},
                    env={PLAN: "0"}, environ={MEGA: "0"})
    assert out == f"got {PLAN}=0 {MEGA}=0 {STANDALONE}=None"


def test_a_vllm_without_the_variables_gets_none_and_no_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = VllmInfo("0.0.0+fake", None, frozenset())
    out, logged = launch(tmp_path, monkeypatch, fake, {})
    assert out == f"got {PLAN}=None {MEGA}=None {STANDALONE}=None"
    assert not cache_warnings(logged), logged


def test_standalone_compile_0_from_the_environment_is_refused_at_launch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, _ = launch(tmp_path, monkeypatch, V026, {"mega_aot_artifact": True},
                    environ={STANDALONE: "0"})
    assert out.startswith("refused: ") and "vLLM refuses to start" in out


@pytest.mark.parametrize("name", ["VLLM_USE_STANDALONE_COMPILE", "VLLM_ENABLE_STARTUP_PLAN",
                                  "VLLM_USE_MEGA_AOT_ARTIFACT", "VLLM_WORKER_MULTIPROC_METHOD"])
def test_a_variable_vllmwatch_decides_is_refused_in_the_env_file(tmp_path: Path,
                                                                 name: str) -> None:
    """The env file is applied last and read by no check: VLLM_USE_STANDALONE_COMPILE=0
    there beside the mega AOT artifact passed `check` and failed vLLM's start on an
    assertion, and the launch's log named a decision the file overrode."""
    from vllmwatch.config.command import build
    from vllmwatch.config.schema import ConfigError, from_dict

    env = tmp_path / "vllm.env"
    env.write_text(f"{name}=0\nHF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz\n")
    env.chmod(0o600)
    config = from_dict({"vllm": {"model": "/m", "gpus": [], "env_file": str(env)}})
    with pytest.raises(ConfigError, match=f"vllm.env_file: {name}") as err:
        build(config, {})
    assert "[vllm.env]" in str(err.value) and "hf_abc" not in str(err.value)
