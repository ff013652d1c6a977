"""`vllmwatch run` where NVML cannot see vLLM's processes under their pids (a container
without the host's PID namespace: NVML lists them under host pids, or lists none at all),
over the fake GPU ledger: the GPU limit still fires, on the device's figure, and the
`memory.source` warning says why (shell/gpufaults.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import PYTHON, Daemon, base_config, free_port, merge
from vllmwatch.testing import fake_gpu
from vllmwatch.testing.daemon import run_argv

# vllmwatch over the fake NVML (testing/gpu_run.py), its process list seen from another PID
# namespace: "host" shifts every pid as a host's numbering would, "none" lists no process
WRAPPER = """
import sys
from vllmwatch.testing import gpu_run
fake = gpu_run.install(sys.argv[1])
listed = fake.nvmlDeviceGetComputeRunningProcesses
def seen(handle):
    got = listed(handle)
    for p in got:
        p.pid += 4_000_000
    return got if sys.argv[2] == "host" else []
fake.nvmlDeviceGetComputeRunningProcesses = seen
from vllmwatch.cli import main
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.parametrize("listing", ["host", "none"])
def test_gpu_limit_fires_when_nvml_lists_vllm_under_other_pids(tmp_path: Path,
                                                               listing: str) -> None:
    ledger = fake_gpu.create(str(tmp_path / "gpu"))
    cfg = merge(base_config(free_port(), free_port()), {
        "vllm": {"gpus": [0]},  # the fake vLLM holds 0.9 of the fake H200: ~126 GiB
        "memory": {"gpu_limit": "100GiB", "sustain": 1, "sample_interval": "0.5s",
                   "baseline_delay": "0s"}})
    argv = run_argv(tmp_path / "vllmwatch.toml", (PYTHON, "-c", WRAPPER, ledger, listing))
    d = Daemon(tmp_path, cfg, argv=argv)
    try:
        d.start()
        d.wait_ready(60)
        fired = d.wait_event("memory.rule_fired", 30.0)
        assert fired["rule"] == "gpu_limit", fired
        said = [e for e in d.named("memory.source") if e.get("level") == "warning"]
        assert len(said) == 1 and said[0]["source"] == "nvml-device", d.named("memory.source")
        assert "PID namespace" in said[0]["why"] and "hostPID" in said[0]["hint"]
        d.wait_event("restart.begin", 30.0, reason="gpu_memory")
    finally:
        d.close()
