"""Issue 37 §1-2 end to end: the real daemon over the fake vLLM with passwords in URLs of its
environment and an API key. Nothing it writes — every log event (child.started's command
and environment), /status, the incident record's files — holds them."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.support import Daemon, base_config, free_port, merge

SECRETS = {"DATABASE_URL": "postgres://bob:Db5ecretPw9@db.internal:5432/app",
           "HTTPS_PROXY": "http://svc:Pr0xyPw7x@proxy:3128",
           "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer 0tlpT0kenZ"}
LEAKS = ("Db5ecretPw9", "Pr0xyPw7x", "0tlpT0kenZ", "sk-DaemonKey0123456789")


def test_no_secret_leaves_the_daemon(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text(LEAKS[3] + "\n")
    key.chmod(0o600)
    cfg = merge(base_config(free_port(), free_port()),
                {"vllm": {"env": SECRETS, "api_key_file": str(key)}})
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", cfg)
    d.start()
    try:
        d.wait_ready(30.0)
        started = d.wait_event("child.started", 5.0)
        assert "postgres://bob:<redacted>@db.internal:5432/app" in started["command"]
        status = d.http_get("/status")[1].decode()
        since = d.mark()
        os.kill(int(started["pid"]), signal.SIGKILL)  # a crash: an incident record
        event = d.wait_event("incident.recorded", 30.0, since)
        d.wait_ready(30.0, since)
        files = {p.name: p.read_text() for p in Path(event["incident_path"]).iterdir()}
    finally:
        d.close()
    written = {"events": json.dumps(d.events), "raw": "\n".join(d.raw), "/status": status,
               **files}
    leaked = [(where, s) for where, text in written.items() for s in LEAKS if s in text]
    assert not leaked, leaked
