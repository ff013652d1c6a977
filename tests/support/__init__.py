"""What the tests share; import from here: `from tests.support import Daemon, base_config,
free_port, wait_for`.

Ports, waiting with deadlines, TOML configs and the one harness around a `vllmwatch run`
process live in vllmwatch/testing/ (ports.py, waiting.py, tomlfile.py, daemon.py), because
bench/ and bench/gpu/ use them too and bench/gpu runs on the GPU machine from an export of
vllmwatch/ and bench/gpu/ alone. Here: the fake vLLM as a server (fakevllm.py), owners that
kill a started process's whole tree (procs.py), and the daemon tier's configs (daemon.py).
"""

from __future__ import annotations

from tests.support.daemon import FAKE, base_config
from tests.support.fakevllm import Fake, completion, fake, http
from tests.support.procs import kill_tree, owned
from vllmwatch.testing.daemon import PYTHON, Daemon, Event, ts_of
from vllmwatch.testing.daemonenv import REPO
from vllmwatch.testing.leftovers import dead, wait_for_gone, wait_for_value, zombie
from vllmwatch.testing.notify import NotifyListener
from vllmwatch.testing.ports import free_port, port_free
from vllmwatch.testing.tomlfile import merge, to_toml, write_toml
from vllmwatch.testing.waiting import (
    FIRST_READY_S,
    TIMEOUT_SCALE,
    holds_within,
    sigstop,
    wait_for,
    wait_until,
)

__all__ = [
    "FAKE", "FIRST_READY_S", "PYTHON", "REPO", "TIMEOUT_SCALE", "Daemon", "Event", "Fake",
    "NotifyListener",
    "base_config", "completion", "dead", "fake", "free_port", "holds_within", "http", "kill_tree",
    "merge", "owned", "port_free", "sigstop", "to_toml", "ts_of", "wait_for", "wait_for_gone",
    "wait_for_value", "wait_until", "write_toml", "zombie",
]
