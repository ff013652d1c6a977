"""The shell's per-child handle: RealEffects keeps nothing of a child run between launches."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import wait_until
from vllmwatch.config import vllminfo
from vllmwatch.config.schema import from_dict
from vllmwatch.core.events import ChildExited, Spawned
from vllmwatch.shell.effects import RealEffects
from vllmwatch.testing import FakeNotifier

# What RealEffects may keep: each lives as long as the daemon. A field about one child run
# belongs in shell/childrun.py's ChildHandle (`_run`), not here.
DAEMON_FIELDS = {"log", "notifier", "_environ", "reaper", "launcher", "marker", "platform",
                 "sampler", "_sampler_gpus", "_fixed_sampler", "_publish", "_versions", "_run",
                 "standby",  # the standby launcher's view
                 "spare",  # the spare engine's runner (issue 34; None when it is off)
                 "_adapters",  # the LoRA adapters' watcher (issue 38)
                 "gate_figures",  # the gate's per-engine figures for incident records (35)
                 "incidents",  # incident records: the last child's evidence, kept on purpose
                 "_caches",  # the cache variables and the start-up cache decision (33)
                 "stop_order",  # the gate's fence, told before any signal (daemon lifetime)
                 "new_engine"}  # ... and told of each launch's pid (a reused pid is new)

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
    told: list[int] = []
    fx.new_engine = told.append
    before = dict(vars(fx))
    got = fx.spawn(config, lambda _e: None)
    assert isinstance(got, Spawned) and got.pid > 0
    assert told == [got.pid], "the gate was not told of the launch's pid"
    changed = {k for k, v in vars(fx).items() if v is not before[k]}
    assert changed == {"_run"}  # the launch is all in the handle
    wait_until(fx.child_exit_pending, 20, "the child exits")
    exited = fx.poll_child()
    assert isinstance(exited, ChildExited) and exited.code == 3 and "bye" in exited.last_lines
    after = vars(fx)
    assert set(after) == DAEMON_FIELDS
    assert all(after[k] is before[k] for k in before), "a per-child field outlived the reap"
    fx.close()
