"""An incident record's process titles are cut at 400 characters after the redactor, so a
secret on a command line across the cut never leaves in part (incident/record.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.support.secrets import known_key
from vllmwatch.incident import record
from vllmwatch.testing.waiting import TIMEOUT_SCALE, wait_for


@pytest.mark.parametrize("before_cut", [3, 10])
def test_a_key_across_the_title_cut_is_hidden(monkeypatch: pytest.MonkeyPatch,
                                              before_cut: int) -> None:
    key = known_key(monkeypatch)
    # a lifetime, not a wait: its owner kills it
    head = [sys.executable, "-c", "import time; time.sleep(120)"]
    pad = "p" * (400 - len(" ".join(head)) - len(" --api-key ") - before_cut)
    proc = subprocess.Popen([*head, pad, "--api-key", key + "tail"], start_new_session=True)
    try:
        procs = wait_for(lambda: record.processes(proc.pid), 10.0, "the process in its group")
        title = procs[0].title
        assert title.startswith(" ".join(head)) and len(title) <= 400
        assert not any(key[i:i + 6] in title for i in range(len(key) - 5)), title[-60:]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10 * TIMEOUT_SCALE)
