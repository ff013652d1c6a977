"""The gate asks for vLLM's API key where vLLM does not (gate/apikey.py key_refused).

vLLM 0.32's key middleware guards only /v1, /v2, /inference and /cohere: through the gate's
one address /pooling, /score, /rerank, /classify, /tokenize and /detokenize ran the model for
a client with no key although the operator had set one. Every allow-listed path is now
either vLLM's to guard (under its prefixes), guarded by the gate the same way (Bearer, the
scheme in any case, constant-time compare, OPTIONS let through), or open in both
(/health, /metrics, /version). The fake vLLM models vLLM's middleware (fake_api.unauthorized)
so that the daemon tests prove the parity (tests/daemon/test_gate_api_key_daemon.py)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.shell.test_gate_http import WAIT, _answer, _Upstream
from tests.support import TIMEOUT_SCALE, free_port, wait_until
from vllmwatch.config.schema import from_dict
from vllmwatch.gate import apikey, replay
from vllmwatch.gate.runner import Gate, start_gate
from vllmwatch.status.snapshot import Snapshot
from vllmwatch.testing import fake_api

KEY = "sk-GateParity0123456789"
OPEN_IN_VLLM = ("/score", "/rerank", "/pooling", "/classify", "/tokenize", "/detokenize")


def test_every_allow_listed_path_needs_the_key_at_one_of_the_two_unless_keyless() -> None:
    """The invariant, over the whole allow-list: a request with no key is refused by the gate
    or by vLLM, except on the liveness and monitoring paths vLLM leaves open too."""
    paths = set(replay.CLIENT_PATHS) | {"/v1/responses/resp_1", "/v1/responses/resp_1/cancel"}
    for path in sorted(paths):
        assert replay.allowed(path), path
        by_gate = apikey.key_refused("POST", path, None, KEY)
        by_vllm = fake_api.unauthorized("POST", path, None, KEY)
        if path in apikey.KEYLESS:
            assert not by_gate and not by_vllm, path
        else:
            assert by_gate != by_vllm, f"{path}: checked by neither, or by both"
    assert {p for p in replay.CLIENT_PATHS if apikey.key_refused("POST", p, None, KEY)} == \
        set(OPEN_IN_VLLM)
    assert apikey.VLLM_GUARDED == fake_api.GUARDED_PREFIX


@pytest.mark.parametrize("path", OPEN_IN_VLLM)
@pytest.mark.parametrize(("authorization", "refused"), [
    (None, True), ("", True), ("Bearer", True), ("Bearer ", True), ("Bearer wrong", True),
    (f"Basic {KEY}", True), (f"Bearer {KEY} ", True), (f"Bearer  {KEY}", True),
    (f"Bearer {KEY[:-1]}", True), (f"Bearer {KEY}x", True),
    (f"Bearer {KEY}", False), (f"bearer {KEY}", False), (f"BEARER {KEY}", False)])
def test_the_gate_checks_as_vllm_does(path: str, authorization: str | None,
                                      refused: bool) -> None:
    """Each answer is vLLM's own for the same header on a path it guards (the fake models
    authenticate.py line by line)."""
    assert apikey.key_refused("POST", path, authorization, KEY) is refused
    assert fake_api.unauthorized("POST", "/v1/embeddings", authorization, KEY) is refused


def test_no_key_set_options_and_keyless_paths_pass() -> None:
    for path in OPEN_IN_VLLM:
        assert not apikey.key_refused("POST", path, None, None)
        assert not apikey.key_refused("POST", path, None, "")  # an empty key is none, as vLLM's
        assert not apikey.key_refused("OPTIONS", path, None, KEY)  # CORS preflight: vLLM's :50
    for path in apikey.KEYLESS:
        assert not apikey.key_refused("GET", path, None, KEY)


def test_a_header_with_bytes_that_are_not_utf8_is_refused_not_raised() -> None:
    """aiohttp gives undecodable header bytes as surrogates: refused, never a traceback."""
    assert apikey.key_refused("POST", "/pooling", "Bearer \udcff\udcfe", KEY)


# ---- a request held at the door learns of its wrong key at once (gate/apikey.py HeldKey) ----
# Before, a request with no key or a wrong one that came while vLLM restarted waited at the
# door for the whole restart (a slot of the held bodies' cap meanwhile), and got a 503 saying
# "starting or restarting" at gate.hold_timeout, or its 401 only once vLLM was READY.

NEW = "sk-GateRotated9876543210"


def _ask(port: int, path: str, key: str | None) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 2\r\n"
                     "Connection: close\r\n\r\n{}".encode())
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    return got


@contextmanager
def _held_gate() -> Iterator[tuple[Gate, dict[str, Snapshot]]]:
    """A gate whose door holds (vLLM starting) until the test publishes a ready snapshot."""
    srv = _Upstream(_answer())
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    snap = {"now": Snapshot(state="starting", ready=False, child_pid=7)}
    config = from_dict({"vllm": {"model": "m", "host": "127.0.0.1",
                                 "port": int(srv.server_address[1])},
                        "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}",
                                 "hold_timeout": f"{WAIT:g}s"}})
    gate = start_gate(config, lambda *_a, **_k: None, lambda: snap["now"])
    assert gate is not None
    try:
        yield gate, snap
    finally:
        gate.stop()
        srv.shutdown()
        srv.server_close()
        thread.join(10 * TIMEOUT_SCALE)


class _Asking(threading.Thread):
    def __init__(self, port: int, path: str, key: str | None) -> None:
        super().__init__(daemon=True)
        self.args_, self.got = (port, path, key), b""

    def run(self) -> None:
        self.got = _ask(*self.args_)


@pytest.mark.parametrize("path", ["/v1/completions", "/score"])
@pytest.mark.parametrize("key", [None, "sk-wrong"])
def test_a_held_request_with_a_wrong_key_gets_its_401_at_once(path: str, key: str | None
                                                             ) -> None:
    """The door never opens here: the answer is the 401 of the engine being launched, not a
    503 at gate.hold_timeout; a request with the right key waits, and goes once it opens."""
    with _held_gate() as (gate, snap):
        gate.forwarder.new_engine(7, KEY)
        right = _Asking(gate.port, path, KEY)
        right.start()
        wait_until(lambda: gate.stats.holding == 1, WAIT, "the right key held")
        got = _ask(gate.port, path, key)
        assert got.startswith(b"HTTP/1.1 401"), got[:200]
        assert got.endswith(b'{"error": "Unauthorized"}'), got
        assert gate.stats.unauthorized == 1 and gate.stats.holding == 1
        snap["now"] = Snapshot(state="ready", ready=True, child_pid=7)
        right.join(WAIT)
        assert right.got.startswith(b"HTTP/1.1 200"), right.got[:200]


def test_a_rotated_key_applies_from_the_launch_that_reads_it() -> None:
    """While the engine launched last is told to stop (a reload for a rotated key file), the
    next launch's key is not known: both keys wait; at its launch the old key gets its 401
    at once, the new one is sent to it when it is READY."""
    with _held_gate() as (gate, snap):
        gate.forwarder.new_engine(7, KEY)
        gate.stop_order(7)
        old, new = _Asking(gate.port, "/v1/completions", KEY), _Asking(gate.port, "/score", NEW)
        old.start()
        new.start()
        wait_until(lambda: gate.stats.holding == 2, WAIT, "both held")
        gate.forwarder.new_engine(8, NEW)
        old.join(WAIT)
        assert old.got.startswith(b"HTTP/1.1 401"), old.got[:200]
        assert gate.stats.holding == 1
        snap["now"] = Snapshot(state="ready", ready=True, child_pid=8)
        new.join(WAIT)
        assert new.got.startswith(b"HTTP/1.1 200"), new.got[:200]
