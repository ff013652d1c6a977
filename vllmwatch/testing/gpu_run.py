"""`vllmwatch` over a fake GPU, for the daemon tier: TEST-ONLY, never active in production.

    python -m vllmwatch.testing.gpu_run LEDGER run --config vllmwatch.toml --log-format json

runs the real `vllmwatch` (vllmwatch.cli.main with the arguments after LEDGER) with the fake
NVML (testing/fake_nvml.FakeNvml) over the fake_gpu ledger directory LEDGER standing in for
the `pynvml` module: every `import pynvml` of the daemon (the platform's decision, the memory
sampler, the GPU fault watch, the spare's plan and room) gets it, and the fake vLLMs the
daemon launches ($FAKE_GPU_DIR, set here) write what they hold to the same ledger. So the
sleeping spare's plan is on, and its failover runs in a real `vllmwatch run` process on a box
without a GPU (tests/daemon/test_spare_daemon.py).

Why a wrapper and not an environment variable or a config key read by the daemon: nothing in
the shipped code changes, so no setting of a production host can turn fake GPU figures on.
This module is in vllmwatch/testing/, which the .deb leaves out and which nothing outside
vllmwatch/testing/ imports (tests/core/test_architecture.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from vllmwatch.testing import fake_gpu
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml

USAGE = "usage: python -m vllmwatch.testing.gpu_run LEDGER_DIR <vllmwatch arguments>"


def install(ledger: str) -> FakeNvml:
    """Make `import pynvml` give the fake NVML over `ledger` in this process, and have the
    processes it starts hold their GPU memory there."""
    fake = FakeNvml([FakeGpu(used_mib=0.0, ledger=ledger)])
    sys.modules["pynvml"] = fake  # type: ignore[assignment]
    os.environ[fake_gpu.ENV] = ledger
    return fake


def main(argv: Sequence[str] | None = None) -> int:
    """Install the fake NVML, then run vllmwatch with the remaining arguments."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or not os.path.isfile(os.path.join(args[0], "device.json")):
        print(f"{USAGE}\n(LEDGER_DIR: a fake_gpu.create() directory)", file=sys.stderr)
        return 2
    install(args[0])
    from vllmwatch.cli import main as vllmwatch_main  # after the fake is in place

    return vllmwatch_main(args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
