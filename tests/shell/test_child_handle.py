"""The shell's per-child handle: RealEffects keeps nothing of a child run between launches."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import free_port, launching, wait_for
from vllmwatch.config import vllminfo
from vllmwatch.config.schema import from_dict
from vllmwatch.core.actions import Probe
from vllmwatch.core.events import ChildExited, HealthResult, Spawned
from vllmwatch.core.names import ProbeKind
from vllmwatch.shell.effects import RealEffects
from vllmwatch.testing.driver import FakeNotifier

# What RealEffects may keep: each lives as long as the daemon. A field about one child run
# belongs in shell/childrun.py's ChildHandle (`_run`), not here.
DAEMON_FIELDS = {"log", "notifier", "_environ", "reaper", "launcher", "marker", "platform",
                 "sampler", "_sampler_gpus", "_fixed_sampler", "_publish", "versions", "_run",
                 "standby",  # the standby launcher's view
                 "reads",  # NVML reads of the loop's thread, with a deadline (LoopReads)
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
    fx = RealEffects(config, _quiet, FakeNotifier(),
                     {"PATH": "/usr/bin:/bin", "STATE_DIRECTORY": str(tmp_path / "state")})
    before = dict(vars(fx))
    assert set(before) == DAEMON_FIELDS and fx._run is None
    told: list[tuple[int, int]] = []  # (pid, the largest body with audio it takes)
    fx.new_engine = lambda gen, _key, audio: told.append((gen, audio))
    before = dict(vars(fx))
    got = launching.spawn(fx, config, lambda _e: None)
    assert isinstance(got, Spawned) and got.pid > 0
    assert told == [(got.pid, 4 * ((25 * 2**20 + 2) // 3) + 2**20)], \
        "the gate was not told of the launch's pid and body cap (vLLM's 25 MiB of audio)"
    changed = {k for k, v in vars(fx).items() if v is not before[k]}
    assert changed == {"_run"}  # the launch is all in the handle
    wait_for(fx.child_exit_pending, 20, "the child exits")
    exited = fx.poll_child()
    assert isinstance(exited, ChildExited) and exited.code == 3 and "bye" in exited.last_lines
    after = vars(fx)
    assert set(after) == DAEMON_FIELDS
    assert all(after[k] is before[k] for k in before), "a per-child field outlived the reap"
    fx.close()


# A server whose /health is always 200, with one child titled as vLLM's engine.
TREE = """
import http.server, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
# a lifetime, not a wait: its owner kills it
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "VLLM::EngineCore"])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_while_starting_a_gone_engine_never_keeps_health_unasked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While starting, /health decides and the gone engine is said once; once serving, a gone
    engine is engine_gone at once (/health not asked: it can hang for seconds then). Before,
    a start whose engine watch saw a death (a wall-clock step made it see one in every live
    engine) never asked /health and waited silently until startup.stall_timeout."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    monkeypatch.setattr(vllminfo, "version", lambda _command: None)
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    port = free_port()
    config = from_dict({"vllm": {"command": [sys.executable, str(script)], "model": "m",
                                 "gpus": [], "port": port},
                        "prewarm": {"enabled": False}})
    said: list[tuple[str, dict[str, Any]]] = []
    fx = RealEffects(config, lambda _lvl, ev, **kw: said.append((ev, kw)), FakeNotifier(),
                     {"PATH": "/usr/bin:/bin", "STATE_DIRECTORY": str(tmp_path / "state")})
    try:
        assert isinstance(launching.spawn(fx, config, lambda _e: None), Spawned)
        probe = Probe(ProbeKind.HEALTH, 1, "127.0.0.1", port, "m", config.probe)
        first = wait_for(lambda: (r := fx.probe(probe)).ok and r, 30, "/health 200")
        assert isinstance(first, HealthResult) and not first.engine_gone
        assert fx._run is not None
        [engine] = [p for p in psutil.Process(fx._run.pid).children()
                    if "VLLM::EngineCore" in " ".join(p.cmdline())]
        engine.kill()  # left a zombie: the server never reaps it
        wait_for(lambda: engine.status() == psutil.STATUS_ZOMBIE, 10, "the engine dead")
        for _ in range(2):
            got = fx.probe(probe)
            assert isinstance(got, HealthResult) and got.ok and got.status == 200, got
        gone = [kw for ev, kw in said if ev == "startup.engine_gone"]
        assert len(gone) == 1 and str(engine.pid) in gone[0]["engines"][0], said
        fx.end_start("ready")
        got = fx.probe(probe)
        assert isinstance(got, HealthResult) and got.engine_gone and not got.ok, got
    finally:
        fx.close()
