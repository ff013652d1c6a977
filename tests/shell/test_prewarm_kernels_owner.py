"""The kernel warm script runs in a session of its own (its time-out kills that group), so
neither a Ctrl-C at `vllmwatch prewarm` (the terminal signals only the foreground group) nor
the death of the daemon that ran it reached it: it went on holding the GPU with nobody to
wait for it. Now an interrupted wait kills its group, and the script dies with its parent
(PR_SET_PDEATHSIG, armed by the script itself). Each test kills what it started."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import TIMEOUT_SCALE, dead, wait_for
from tests.support.procs import owned

SLEEPER = ("import os, sys, time\n"
           "open(os.environ['PIDFILE'], 'w').write(str(os.getpid()))\n"
           "time.sleep(600)\n")  # a lifetime, not a wait: its owner kills it


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_the_warm_script_does_not_outlive_an_interrupted_or_dead_prewarm(
        tmp_path: Path, how: signal.Signals) -> None:
    pidfile = tmp_path / "script.pid"
    parent = textwrap.dedent(f"""\
        import os, sys
        from vllmwatch.prewarm import kernels
        kernels.run_script(sys.executable, {{}}, {{**os.environ, "PIDFILE": {str(pidfile)!r}}},
                           300, script={SLEEPER!r})
        """)
    script_pid = 0
    try:
        with owned([sys.executable, "-c", parent], cwd=str(Path(__file__).parents[2])) as proc:
            wait_for(lambda: pidfile.exists() and pidfile.read_text() != "", 60,
                     "the warm script to start")
            script_pid = int(pidfile.read_text())
            proc.send_signal(how)  # Ctrl-C at `vllmwatch prewarm`; the daemon killed
            proc.wait(30 * TIMEOUT_SCALE)
            wait_for(lambda: dead(script_pid), 10, f"the warm script {script_pid} to die")
    finally:
        if script_pid and not dead(script_pid):
            with contextlib.suppress(OSError):
                os.killpg(script_pid, signal.SIGKILL)
