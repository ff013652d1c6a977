"""The sweep's kinship rules in process: descendants of what is ours are ours (a setsid'd,
env-cleared grandchild), and a sweep never takes its own line (an ancestor with our marker)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.support import REPO, TIMEOUT_SCALE, wait_for
from vllmwatch.shell import child

# a lifetime, not a wait: its owner kills it
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_setsid_grandchild_of_ours_is_found(tmp_path: Path) -> None:
    marker = f"kin{os.getpid()}"
    spawner = ("import subprocess, sys, time; p = subprocess.Popen(sys.argv[1:], env={}, "
               # a lifetime, not a wait: its owner kills it
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
                         capture_output=True, text=True, timeout=60 * TIMEOUT_SCALE)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_a_foreign_vllm_is_named_as_it_was_seen(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep waits up to `grace` for a busy port; a foreign vLLM that ends meanwhile is
    still named by its command line, read when it was found (not 'pid N' alone)."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    go = tmp_path / "go"
    # it lives until the go-file (the test's finally kills it)
    script = ("import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)")
    foreign = subprocess.Popen([sys.executable, "-c", script, str(go), "vllm serve", "tiny"],
                               start_new_session=True)
    with socket.socket() as busy:  # the port the sweep waits on stays held throughout
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        try:
            wait_for(lambda: "vllm serve" in " ".join(psutil.Process(foreign.pid).cmdline()),
                     10, "the foreign vLLM started")
            real_holder = child.port_holder

            def holder_once_foreign_gone(host: str, port: int, ignore: set[int]) -> str | None:
                # It ends while the sweep waits on the port: at the wait's first look, not
                # after a time (a scan slower than the old 0.5 s timer, as on a loaded box,
                # found it already gone).
                go.touch()
                foreign.wait(30 * TIMEOUT_SCALE)
                return real_holder(host, port, ignore)

            monkeypatch.setattr(child, "port_holder", holder_once_foreign_gone)
            done = child.sweep(None, f"foreign{os.getpid()}", "127.0.0.1", port, grace=3.0)
            assert foreign.returncode == 0, "the foreign vLLM ended before the sweep returned"
        finally:
            foreign.kill()
            foreign.wait()
    [seen] = [d for d in done.foreign_vllm if d.split(" (")[0] == f"pid {foreign.pid}"]
    assert seen.startswith(f"pid {foreign.pid} ({sys.executable} -c import"), done.foreign_vllm
    assert done.port_holder is not None and not done.killed
