"""A vLLM tree that dies before the daemon's first GPU memory sample (the sample starts at
READY: every failed start) still goes through the GPU release gate: the gate knows the root's
pid and every pid the sweep found, and compares device memory with the launch's. Before, the
gate opened only on the last sample's pids or the sweep's kills, so a tree that died on its
own before READY left it with nothing to wait on: the relaunch met the dead engine's memory
still held and failed vLLM's start-up free-memory check (a restart spent, reason
start_memory). The fake GPU ledger keeps a dead process's memory a while, as a driver does
(fake_gpu release_lag_s; issue 33 measured 0.4 s to 1.4 s on an H200)."""

from __future__ import annotations

from pathlib import Path

from tests.daemon.test_spare_daemon import SCRIPT
from tests.support.daemon import base_config
from vllmwatch.testing import fake_gpu
from vllmwatch.testing.daemon import PYTHON, Daemon, run_argv
from vllmwatch.testing.ports import free_port
from vllmwatch.testing.tomlfile import merge
from vllmwatch.testing.waiting import FIRST_READY_S

LAG_S = 6.0  # longer than a relaunch takes on a loaded box, far below the gate's 60 s


def test_a_tree_dead_before_its_first_sample_is_waited_for(tmp_path: Path) -> None:
    script = tmp_path / "vllm"
    script.write_text(SCRIPT.format(python=PYTHON))
    script.chmod(0o755)
    ledger = fake_gpu.create(str(tmp_path / "gpu"), total_mib=80000, release_lag_s=LAG_S)
    # The READY completion ("Hello") crashes the engine: the tree dies before any sample.
    cfg = merge(base_config(free_port(), free_port()), {
        "vllm": {"command": [str(script), "--startup-seconds", "0.3", "--crash-on-prompt", "e",
                             "--engine-death-exit-delay", "0.2",
                             "--gpu-memory-utilization", "0.6"],
                 "model": "tiny", "gpus": [0]},
        "restart": {"standby": "false"}})
    argv = run_argv(tmp_path / "vllmwatch.toml",
                    (PYTHON, "-m", "vllmwatch.testing.gpu_run", ledger))
    d = Daemon(tmp_path, cfg, argv=argv, own_session=True)
    d.start()
    try:
        first = d.wait_event("child.exited", FIRST_READY_S)
        assert not d.named("child.ready"), "the fault must end the tree before READY"
        since = d.events.index(first)
        d.wait_event("child.started", FIRST_READY_S, since)
        between = [e.get("event") for e in d.events[since:]]
        relaunch = between.index("child.started")
        assert "gpu.released" in between[:relaunch] or \
            "gpu.release_timeout" in between[:relaunch], \
            f"relaunched without the release gate: {between[:relaunch]}\n{d.dump()}"
        d.wait_event("child.exited", FIRST_READY_S, since + relaunch)
        assert not d.named("start.memory_failure"), \
            "the relaunch met the dead tree's GPU memory\n" + d.dump()
    finally:
        d.close()
