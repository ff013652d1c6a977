"""A server that takes vLLM's port during vLLM's start is not vLLM (shell/ports.py).

vllmwatch checks the port before each launch, but vLLM binds it after its imports. A server
started in between answered /health and the canary, and vllmwatch said READY on its answers
(CI, 2026-12-06: a real vLLM's test found no EngineCore under a READY child: another test
lane's server had the port the kernel gave out twice). Now the start waits, says
startup.port_taken with the holder once, and READY comes from our own vLLM's answers only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import TIMEOUT_SCALE, Daemon, base_config, fake, free_port, http, merge, wait_for
from vllmwatch.shell import ports


@pytest.mark.parametrize("stranger_stays", [False, True])
def test_a_stranger_on_the_port_during_the_start_gives_no_ready(tmp_path: Path,
                                                              stranger_stays: bool) -> None:
    port, bind = free_port(), tmp_path / "bind"
    cfg = merge(base_config(port, free_port()), {"vllm": {
        "served_model_name": "tiny", "extra_args": ["--hold-bind-until", str(bind)]}})
    (tmp_path / "d").mkdir()
    (tmp_path / "s").mkdir()
    d = Daemon(tmp_path / "d", cfg)
    try:
        d.start()
        child = d.wait_event("child.started", 30)["pid"]
        mark = d.mark()
        # the stranger answers like our vLLM would: same served name, /health and canary
        with fake(tmp_path / "s", "--port", str(port), "--served-model-name", "tiny",
                  ready=0) as stranger:
            wait_for(lambda: http(port, "/health", timeout=1)[0] == 200, 30, "the stranger")
            taken = d.wait_event("startup.port_taken", 30, mark)
            assert taken["holder"].startswith(f"pid {stranger.proc.pid} "), taken
            assert taken["port"] == f"127.0.0.1:{port}" and "vllm.port" in taken["detail"]
            # five more /health answers of the stranger's: still no READY, no canary sent to
            # it (the start never got past /health), startup.port_taken said once
            seen = stranger.log.read_text().count("GET /health")
            wait_for(lambda: stranger.log.read_text().count("GET /health") >= seen + 5, 30,
                     "five more start polls")
            assert "POST /v1/" not in stranger.log.read_text()
            assert not d.named("child.ready", mark), d.dump()
            assert len(d.named("startup.port_taken", mark)) == 1, d.dump()
            if stranger_stays:  # our vLLM's bind fails, it exits; the relaunch meets the holder
                bind.touch()
                assert d.wait_exit(60 * TIMEOUT_SCALE) == 69, d.dump()
                busy = d.named("port.busy", mark)
                assert busy and f"pid {stranger.proc.pid}" in str(busy[-1]), d.dump()
                assert not d.named("child.ready", mark), d.dump()
                return
        bind.touch()  # the stranger is gone: our vLLM binds and READY is its own
        ready = d.wait_ready(60, mark)
        assert ready["pid"] == child, ready
    finally:
        d.close()


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield sock
    sock.close()


def _child(tmp_path: Path, name: str) -> subprocess.Popen[bytes]:
    """A process named `name` (a link to sleep): comm is the link's name."""
    link = tmp_path / name
    link.symlink_to("/bin/sleep")
    return subprocess.Popen([str(link), "60"], start_new_session=True)


@pytest.mark.parametrize("name", ["sleep", "docker", "podman"])
def test_only_a_tree_that_runs_vllm_itself_is_judged(tmp_path: Path, name: str,
                                                     listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    proc = _child(tmp_path, name)
    try:
        who = ports.stranger(proc.pid, "127.0.0.1", port)
        if name == "sleep":  # the listener (this test's process) is outside the tree
            assert who == os.getpid(), who
        else:  # a container runtime's CLI: its proxy holds the port, outside by design
            assert who is None, who
        assert ports.stranger(os.getpid(), "127.0.0.1", port) is None  # in the tree
        assert ports.stranger(proc.pid, "127.0.0.1", free_port()) is None  # no listener
    finally:
        proc.kill()
        proc.wait(10 * TIMEOUT_SCALE)


def test_a_listener_in_a_child_of_the_tree_is_ours(tmp_path: Path) -> None:
    # a listener two levels down; its sleep is its lifetime (the finally kills its group)
    code = ("import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(1);"
            "print(s.getsockname()[1], flush=True); time.sleep(60)")
    outer = subprocess.Popen(["sh", "-c", f'{sys.executable} -c "{code}"; :'],
                             stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert outer.stdout is not None
        port = int(outer.stdout.readline())
        assert ports.stranger(outer.pid, "127.0.0.1", port) is None
        assert ports.stranger(outer.pid, "", port) is None  # the wildcard overlaps too
    finally:
        os.killpg(outer.pid, 9)
        outer.wait(10 * TIMEOUT_SCALE)
