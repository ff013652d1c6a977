"""Every byte vllmwatch writes passes the one redactor, the libraries' own log records too.
aiohttp's server reports a request it cannot parse on the stdlib logger "aiohttp.server"
with the offending header quoted (a client's API key included) and a traceback; nothing
configured stdlib logging, so it reached stderr (the journal) through logging's lastResort
handler. logs.setup now bridges the stdlib loggers into `library.message` events: redacted,
no traceback, at most one per logger a minute with the count of those held back."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys

from tests.support import REPO, TIMEOUT_SCALE
from vllmwatch.shell import logs

SECRET = "sk-live-9f8e7d6c5b4a39281706"

# The daemon's order: logs.setup first, then the gate with that log function.
_CHILD = """
import sys
from vllmwatch.shell.logs import setup
from vllmwatch.gate.door import Readiness
from vllmwatch.gate.runner import Gate
from vllmwatch.testing.ports import free_port
log = setup(fmt="json", stream=sys.stderr)
port = free_port()
g = Gate("127.0.0.1:%d" % port, "http://127.0.0.1:9", lambda: Readiness.OPEN, 1.0,
         retry_after=1, log=log, generation=lambda: 1)
g.start()
print(port, flush=True)
sys.stdin.read()
g.stop()
"""


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10 * TIMEOUT_SCALE) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_a_request_aiohttp_cannot_parse_is_logged_redacted_once_and_without_a_traceback(
        ) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        bad = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
               + SECRET.encode() + b"\x01\r\nContent-Length: 2\r\n\r\n{}")
        for _ in range(3):  # a client sending bad requests in a loop: one line, not three
            assert _raw(port, bad).split(b" ")[1] == b"400"
        _out, err = proc.communicate(b"", timeout=30 * TIMEOUT_SCALE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10 * TIMEOUT_SCALE)
    text = err.decode(errors="replace")
    assert SECRET not in text, text
    assert "Traceback" not in text, text
    events = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    library = [e for e in events if e.get("event") == "library.message"]
    assert len(library) == 1, text
    assert library[0]["logger"] == "aiohttp.server", library
    assert "(the request's bytes, not shown)" in library[0]["error"], library  # any shape
    assert [line for line in text.splitlines() if not line.startswith("{")] == [], text


def test_the_bridge_holds_back_repeats_and_counts_them() -> None:
    got: list[tuple[str, str, dict[str, object]]] = []
    now = [0.0]
    bridge = logs.Bridge(lambda level, event, **f: got.append((level, event, f)),
                         clock=lambda: now[0])
    logger = logging.getLogger("vllmwatch-test.bridge")
    logger.propagate, logger.handlers = False, [bridge]
    try:
        for i in range(5):
            logger.warning("token=%s seen %d", SECRET, i)
        now[0] = logs.LIBRARY_EVERY + 1
        try:
            raise ValueError("Authorization: Bearer " + SECRET)
        except ValueError:
            logger.exception("Error handling request")
        logger.info("below the bridge's level")
    finally:
        logger.handlers = []
    assert [(level, event) for level, event, _ in got] == [
        ("warning", "library.message"), ("error", "library.message")]
    assert got[0][2]["since_last"] == 0 and got[1][2]["since_last"] == 4
    assert got[1][2]["error"] == "ValueError: Authorization: Bearer " + SECRET  # (raw here:
    # the redactor is the log function's, shown by the test above)


def test_setup_replaces_the_bridge_instead_of_stacking_it() -> None:
    handlers, level = logging.root.handlers[:], logging.root.level
    try:
        with open("/dev/null", "w") as sink:
            logs.setup(fmt="json", stream=sink)
            logs.setup(fmt="json", stream=sink)
        assert [type(h) for h in logging.root.handlers] == [logs.Bridge]
    finally:
        logging.root.handlers = handlers
        logging.root.setLevel(level)
