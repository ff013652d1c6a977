"""The shell's per-child handle: RealEffects keeps nothing of a child run, the core ends the
start, and the canary kind `auto` found travels through the core."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from vllmwatch.config import vllminfo
from vllmwatch.config.schema import from_dict
from vllmwatch.core import machine
from vllmwatch.core.events import CanaryResult, ChildExited, Probe, Spawned, Tick
from vllmwatch.core.state import S
from vllmwatch.shell.effects import RealEffects
from vllmwatch.testing import Driver, FakeNotifier, World

# What RealEffects may keep: each lives as long as the daemon. A field about one child run
# belongs in shell/childrun.py's ChildHandle (`_run`), not here.
DAEMON_FIELDS = {"log", "notifier", "_environ", "reaper", "launcher", "marker", "platform",
                 "sampler", "_sampler_gpus", "_fixed_sampler", "_publish", "_versions", "_run"}

CHILD = [sys.executable, "-c", "import sys; print('bye', flush=True); sys.exit(3)"]


def _quiet(*_a: Any, **_k: Any) -> None:
    return None


def test_real_effects_keeps_no_per_child_field(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))  # the group file
    monkeypatch.setattr(vllminfo, "version", lambda _command: None)
    config = from_dict({"vllm": {"command": CHILD, "model": "m", "gpus": []},
                        "prewarm": {"enabled": False}})
    fx = RealEffects(config, _quiet, FakeNotifier(), {"PATH": "/usr/bin:/bin"})
    before = dict(vars(fx))
    assert set(before) == DAEMON_FIELDS and fx._run is None
    got = fx.spawn(config, lambda _e: None)
    assert isinstance(got, Spawned) and got.pid > 0
    changed = {k for k, v in vars(fx).items() if v is not before[k]}
    assert changed == {"_run"}  # the launch is all in the handle
    wait_until(fx.child_exit_pending, 20, "the child exits")
    exited = fx.poll_child()
    assert isinstance(exited, ChildExited) and exited.code == 3 and "bye" in exited.last_lines
    after = vars(fx)
    assert set(after) == DAEMON_FIELDS
    assert all(after[k] is before[k] for k in before), "a per-child field outlived the reap"
    fx.close()


BASE = from_dict({
    "vllm": {"model": "/m", "gpus": []},
    "probe": {"interval": 5, "timeout": 2, "canary_interval": 60, "canary_timeout": 30},
    "restart": {"backoff_initial": 5, "backoff_jitter": 0.0},
    "prewarm": {"enabled": False},
})


def test_the_core_ends_the_start_at_ready_and_when_the_start_is_left() -> None:
    d = Driver(BASE, world=World())
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    assert d.fx.starts_over == ["ready"]
    d.signal(signal.SIGTERM)
    assert d.run_until(lambda: d.exit_code is not None, 120)
    assert d.fx.starts_over == ["ready"]  # a stop after READY: the start was over already
    d2 = Driver(BASE, world=World(canary_ok=False))
    assert d2.run_until(lambda: d2.state.state == S.STARTING, 30)
    d2.signal(signal.SIGTERM)
    assert d2.run_until(lambda: d2.exit_code is not None, 120)
    assert d2.fx.starts_over == ["stopping"]


def test_the_canary_kind_auto_found_lives_in_the_child_run() -> None:
    d = Driver(BASE, world=World())
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    c = d.state.child
    assert c is not None and c.canary_kind is None  # the World names no kind
    s, _ = machine.step(d.state, CanaryResult(True, False, 0.01, gen=c.gen, kind="embeddings"),
                        d.clock.now)
    s, _ = machine.step(s, CanaryResult(True, False, 0.01, gen=c.gen), d.clock.now)
    assert s.child is not None and s.child.canary_kind == "embeddings"  # kept, not reset
    s, acts = machine.step(s, Tick(), d.clock.now + BASE.probe.canary_interval + 1)
    probes = [a for a in acts if isinstance(a, Probe) and a.kind == "canary"]
    assert probes and probes[0].canary_kind == "embeddings"  # the next canary asks for it
