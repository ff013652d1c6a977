"""The daemon tier's configs: `vllmwatch run` over the fake vLLM, quick to start and to fail.

The harness itself is vllmwatch/testing/daemon.py (bench/ and bench/gpu/ use it too).
"""

from __future__ import annotations

from typing import Any

from vllmwatch.testing.daemon import PYTHON

# The incident record's deadline for a test that waits for incident.recorded: a deadline,
# not its length (the record ends when its dumpers are done). The shipped 3 s is passed on a
# loaded 2-core box by a live tree's dumps (a run timed out at 5 s: incident.timeout, and
# the record waited for never came).
RECORD = {"incidents": {"timeout": "20s"}}

# The fake vLLM as the daemon's command, quick to start.
FAKE = [PYTHON, "-m", "vllmwatch.testing.fake_vllm", "--startup-seconds", "0.3"]


def base_config(port: int, status_port: int, fake_args: list[str] | None = None
                ) -> dict[str, dict[str, Any]]:
    """The daemon over the fake vLLM with short intervals everywhere, so that each fault
    shows within a second or two."""
    return {
        "vllm": {"command": FAKE, "model": "tiny", "port": port, "gpus": [],
                 "extra_args": fake_args or []},
        "probe": {"interval": "0.5s", "timeout": "1s", "canary_interval": "1s",
                  "canary_timeout": "1s", "metrics_interval": "0.5s"},
        "restart": {"backoff_initial": "0.2s", "backoff_max": "1s", "drain_timeout": "2s",
                    "stop_timeout": "3s"},
        "prewarm": {"enabled": False},
        "status": {"listen": f"127.0.0.1:{status_port}"},
    }
