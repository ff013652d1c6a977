"""A finished daemon exits with its code even when a worker thread is stuck for good (NVML
wedged on a faulted GPU, a /proc read of a process in D state): Python's exit joins every
worker thread, so before, the process stayed until systemd's TimeoutStopSec killed it, and a
74 or 75 that must not be restarted became a kill that is (daemon.leave_past_stuck_threads).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import TIMEOUT_SCALE

SCRIPT = """
import threading, time
from vllmwatch import daemon
def log(level, event, **fields):
    print(level, event, fields["threads"], fields["code"], flush=True)
# work that ends well within join_s
work = threading.Event().wait if {stuck} else (lambda: time.sleep(0.05))
threading.Thread(target=work, name="sample-worker").start()
daemon.leave_past_stuck_threads(74, log, join_s={join_s})
print("returned", flush=True)
"""


@pytest.mark.parametrize("stuck", [True, False])
def test_a_stuck_worker_never_keeps_a_finished_daemon(stuck: bool) -> None:
    # The bound is a hang's, not a speed target: the stuck case exits after join_s (3 s). The
    # worker that ends must end within it, and a loaded box can stall the child's thread start
    # and its 0.05 s of work for seconds: its join_s scales (it costs nothing, the join ends
    # with the thread).
    join_s = 3.0 if stuck else 3.0 * TIMEOUT_SCALE
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(stuck=stuck, join_s=join_s)],
                          capture_output=True, text=True, timeout=120 * TIMEOUT_SCALE)
    if stuck:
        assert done.returncode == 74, done
        assert done.stdout.splitlines() == [
            "warning daemon.threads_stuck ['sample-worker'] 74"], done.stdout
    else:  # a worker that ends within the wait: the normal exit path, nothing logged
        assert done.returncode == 0 and done.stdout.splitlines() == ["returned"], done
