"""The sweep's kinship rules in process: descendants of what is ours are ours (a setsid'd,
env-cleared grandchild), and a sweep never takes its own line (an ancestor with our marker)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support import REPO, wait_for
from vllmwatch.shell import child

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_setsid_grandchild_of_ours_is_found(tmp_path: Path) -> None:
    marker = f"kin{os.getpid()}"
    spawner = ("import subprocess, sys, time; p = subprocess.Popen(sys.argv[1:], env={}, "
               "start_new_session=True); print(p.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", spawner, *SLEEP],
                              env={**os.environ, child.MARKER: marker}, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    grandchild = 0
    try:
        assert parent.stdout is not None
        grandchild = int(parent.stdout.readline())
        assert os.getsid(grandchild) == grandchild  # its own session, no marker
        ours, _ = child.find_tree(None, marker)
        assert {parent.pid, grandchild} <= {p.pid for p in ours}
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        wait_for(lambda: parent.poll() is not None, 10, "the parent gone")
        if grandchild:
            with contextlib.suppress(ProcessLookupError):
                os.kill(grandchild, signal.SIGKILL)


def test_a_sweep_never_takes_its_own_line(tmp_path: Path) -> None:
    marker = f"line{os.getpid()}"
    probe = textwrap.dedent("""
        import os
        from vllmwatch.shell import child
        ours, _ = child.find_tree(None, os.environ["VLLMWATCH_INSTANCE"])
        print(os.getppid() in {p.pid for p in ours})
    """)
    # The shell (our parent) carries the marker, as a debugging shell with the env copied would.
    out = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0"; true', probe],
                         env={**os.environ, child.MARKER: marker, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
