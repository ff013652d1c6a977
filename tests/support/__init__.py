"""What tests and benchmarks share: ports, waiting with deadlines, TOML configs, the fake vLLM
as a server, and the one harness around a `vllmwatch run` process (tests/support/daemon.py).

Import from here: `from tests.support import Daemon, base_config, free_port, wait_for`.
"""

from __future__ import annotations

from tests.support.daemon import (
    FAKE,
    PYTHON,
    REPO,
    Daemon,
    Event,
    NotifyListener,
    base_config,
    ts_of,
    wait_for_gone,
    wait_for_value,
)
from tests.support.fakevllm import Fake, completion, fake, http
from tests.support.ports import free_port, port_free
from tests.support.tomlfile import merge, to_toml, write_toml
from tests.support.waiting import TIMEOUT_SCALE, holds_within, wait_for, wait_until

__all__ = [
    "FAKE", "PYTHON", "REPO", "TIMEOUT_SCALE", "Daemon", "Event", "Fake", "NotifyListener",
    "base_config", "completion", "fake", "free_port", "holds_within", "http", "merge",
    "port_free", "to_toml", "ts_of", "wait_for", "wait_for_gone", "wait_for_value",
    "wait_until", "write_toml",
]
