"""Issue 23 §2 with the real daemon: a server that answers every request 200 with an HTML
page (a proxy's error page, the wrong server on the port) never makes vllmwatch READY."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import PYTHON, Daemon, free_port

STUB = str(Path(__file__).resolve().parent / "stub_vllm.py")


@pytest.mark.parametrize("body", [b"<html><body>It works!</body></html>", b""])
def test_an_html_or_empty_200_is_never_ready(tmp_path: Path, body: bytes) -> None:
    (tmp_path / "body").write_bytes(body)
    port = free_port()
    d = Daemon(tmp_path, {
        "vllm": {"command": [PYTHON, STUB, "--body-file", str(tmp_path / "body")],
                 "model": "tiny", "port": port, "gpus": []},
        "prewarm": {"enabled": False}, "log": {"level": "debug"},
        "status": {"listen": f"127.0.0.1:{free_port()}"}})
    d.start()
    try:
        for _ in range(3):  # three canaries in a row refused, each for its body
            seen = len(d.named("startup.canary_not_yet"))
            got = d.wait_event("startup.canary_not_yet", 30.0, d.events.index(
                d.named("startup.canary_not_yet")[-1]) + 1 if seen else 0)
            assert "HTTP 200 from /v1/" in got["error"] and "not JSON" in got["error"]
        assert not d.named("child.ready")
        assert d.notify is not None and not d.notify.with_prefix("READY=1")
        assert d.http_get("/readyz")[0] == 503
    finally:
        d.close()
