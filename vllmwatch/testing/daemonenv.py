"""The environment a test's `vllmwatch run` (testing/daemon.py) starts with: the caller's,
less what systemd would have set for a real unit (a test is not one), plus the harness's own
notify socket and this checkout first on PYTHONPATH, so that the daemon imports the code
under test and not an installed copy."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from vllmwatch.testing.notify import NotifyListener

# The folder that holds this vllmwatch (the checkout), put on the daemon's PYTHONPATH.
REPO = Path(__file__).resolve().parents[2]
SYSTEMD_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM")


def daemon_env(env: Mapping[str, str] | None, notify: NotifyListener | None,
               checkout_path: bool) -> dict[str, str]:
    """The daemon's environment: ours (or env) without systemd's variables, plus env, the
    notify socket and (checkout_path) this checkout on PYTHONPATH."""
    out = dict(os.environ if env is None else env)
    for name in SYSTEMD_VARS:
        out.pop(name, None)
    if env is not None:
        out.update(env)
    if notify is not None:
        out["NOTIFY_SOCKET"] = notify.path
    if checkout_path:
        out["PYTHONPATH"] = str(REPO) + os.pathsep + out.get("PYTHONPATH", "")
    return out
