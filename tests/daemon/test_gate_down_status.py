"""READY=1 means the clients' address answers. A daemon whose [gate] could not bind
gate.listen still sent READY=1 once vLLM served: `systemctl start` returned, the units
ordered After= it started, and every client of gate.listen got connection errors
(`gate down: ...` on the STATUS= line and a 503 from /readyz were all that said so). The
start now ends before vLLM is launched, exit 69 (port_busy, as for a busy vllm.port), the
holder named in `daemon.exiting` and on the last STATUS= line. A gate that dies later is
said on the STATUS= line (tests/loop/test_status_line_fit.py, tests/shell/test_status.py)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from tests.support import Daemon, base_config, free_port, merge, wait_for
from vllmwatch.core import exitcodes


def test_a_gate_that_cannot_listen_ends_the_start_and_never_says_ready(tmp_path: Path) -> None:
    with socket.socket() as taken:  # another process (this test's) holds gate.listen
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        cfg = merge(base_config(free_port(), free_port()),
                    {"gate": {"enabled": True, "listen": f"127.0.0.1:{port}"}})
        d = Daemon(tmp_path, cfg).start()
        try:
            assert d.wait_exit(60) == exitcodes.START
            [said] = d.named("daemon.exiting")
            assert said["reason"] == "port_busy" and said["port"] == f"127.0.0.1:{port}"
            assert f"pid {os.getpid()}" in said["holder"], said  # who holds it, by pid
            assert not d.named("child.started")  # nothing launched for clients to miss
            notify = d.notify
            assert notify is not None
            wait_for(lambda: notify.count("STATUS=") > 0, 5.0, "the exit's STATUS= line")
            told = [text for _, text in notify.lines()]
            assert not any("READY=1" in text for text in told), told
            assert any("STOPPING=1" in text for text in told), told
            status = [text for text in told if text.startswith("STATUS=")]
            assert f"exiting 69: port_busy (gate.listen 127.0.0.1:{port}" in status[-1], status
        finally:
            d.close()
