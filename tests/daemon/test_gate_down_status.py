"""The unit's STATUS= line says when the [gate] front door is down: `systemctl status` read
"ready | up ..." (and the unit active) for a daemon whose gate could not bind gate.listen, or
died, while every client of gate.listen got connection errors; `gate.failed` was in the
journal alone; and /readyz answered 200 to a balancer that sends the traffic to the gate's
port (a black hole)."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.support import Daemon, base_config, free_port, merge, wait_for


def test_a_gate_that_cannot_listen_is_said_on_the_status_line(tmp_path: Path) -> None:
    with socket.socket() as taken:  # another process holds gate.listen
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        cfg = merge(base_config(free_port(), free_port()),
                    {"gate": {"enabled": True, "listen": f"127.0.0.1:{port}"}})
        d = Daemon(tmp_path, cfg).start()
        try:
            d.wait_event("gate.failed", 30)
            d.wait_ready(30)
            notify = d.notify
            assert notify is not None

            def said() -> list[str]:
                return [line for _, line in notify.with_prefix("STATUS=ready")]

            lines = wait_for(said, 10.0, "a STATUS= line after READY")
            assert all("gate down: gate.listen 127.0.0.1:" in line for line in lines), lines
            code, body = d.http_get("/readyz")  # vLLM is ready; the clients' address is not
            assert code == 503 and b"not ready: gate down: gate.listen 127.0.0.1:" in body, body
            code, _ = d.stop()
            assert code == 0
        finally:
            d.close()
