"""The whole suite in two lanes at once: the tests that run a real vLLM (marker e2e), one at a
time in one pytest, beside everything else in another.

Why: a real CPU vLLM's start is mostly waiting (measured: 2 busy-loop hogs on 2 cores slowed it
by only 15-30 %), and so is most of the daemon tier, so one pytest after the other left the
machine half idle and took 82 of CI's 90 minutes. Two real vLLMs never run at once (their
startup bounds assume one); every test already waits on conditions, owns its processes and
picks free ports, which is what makes a loaded neighbour safe.

The rest lane prints live; the real-vLLM lane's output is kept in a file and printed whole
when both are done (interleaved progress lines read as nonsense). Each lane has its own
session, so a Ctrl-C or a SIGTERM reaches it once, forwarded from here (not also from the
terminal's process group, which would interrupt the teardowns it started), and it gets SIGTERM
if this runner dies; pytest runs its teardowns (tests/conftest.py); both outputs are printed.
Exit status: 0 only when both lanes pass; else the first lane's non-zero status.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType

PR_SET_PDEATHSIG = 1
LANES = (
    ("real vLLM", ["-m", "e2e", "-o", "cache_dir=.pytest_cache/e2e"]),
    ("the rest", ["-m", "not e2e"]),
)
# Each lane's own ports (vllmwatch/testing/ports.py), below the kernel's ephemeral range: a
# port one lane was given free could be given again to the other, or to a connection, in the
# seconds before a real vLLM binds it (CI, 2026-12-06: another lane's server answered there).
PORTS_ENV, PORTS = "VLLMWATCH_TEST_PORTS", ("10000-14999", "15000-32767")


def _tied() -> None:
    """In the lane, before pytest: SIGTERM when this runner dies (even by SIGKILL), so a lane
    never outlives it; pytest takes SIGTERM as Ctrl-C and runs its teardowns. SIGINT and
    SIGTERM at their defaults: a runner started in the background (`cmd &`, nohup) inherits
    them ignored, and an ignored SIGINT survives exec, so the lane would ignore a forwarded
    Ctrl-C and pass the ignore on to every process a test starts (the demo's Ctrl-C trap)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def main(argv: list[str]) -> int:
    python = argv[0] if argv else sys.executable
    log = Path(tempfile.mkdtemp(prefix="vllmwatch-lanes-")) / "e2e.log"
    started = time.monotonic()
    with log.open("wb") as out:
        procs = [
            subprocess.Popen([python, "-m", "pytest", "-ra", *LANES[0][1]], stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_tied,
                             env={**os.environ, PORTS_ENV: PORTS[0]}),
            subprocess.Popen([python, "-m", "pytest", "-ra", *LANES[1][1]],
                             start_new_session=True, preexec_fn=_tied,
                             env={**os.environ, PORTS_ENV: PORTS[1]}),
        ]

        def forward(signum: int, _frame: FrameType | None) -> None:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        took: dict[int, float] = {}

        def wait(i: int) -> None:
            procs[i].wait()
            took[i] = time.monotonic() - started

        waiters = [threading.Thread(target=wait, args=(i,)) for i in range(len(procs))]
        for waiter in waiters:
            waiter.start()
        for waiter in waiters:  # the main thread stays free to forward a signal
            while waiter.is_alive():
                waiter.join(1.0)
    codes = [proc.returncode for proc in procs]
    print(f"\n{'=' * 30} lane: {LANES[0][0]} (pytest {' '.join(LANES[0][1])}) {'=' * 30}",
          flush=True)
    sys.stdout.buffer.write(log.read_bytes())
    sys.stdout.flush()
    shutil.rmtree(log.parent, ignore_errors=True)
    for i, (name, _) in enumerate(LANES):
        print(f"[test] lane {name!r}: exit {codes[i]}, done {took[i] / 60:.1f} min after the start")
    return next((code for code in codes if code != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
