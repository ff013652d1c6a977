"""The gate asks for vLLM's API key where vLLM does not (gate/door.py key_refused).

vLLM 0.32's key middleware guards only /v1, /v2, /inference and /cohere: through the gate's
one address /pooling, /score, /rerank, /classify, /tokenize and /detokenize ran the model for
a client with no key although the operator had set one. Every allow-listed path is now
either vLLM's to guard (under its prefixes), guarded by the gate the same way (Bearer, the
scheme in any case, constant-time compare, OPTIONS let through), or open in both
(/health, /metrics, /version). The fake vLLM models vLLM's middleware (fake_api.unauthorized)
so that the daemon tests prove the parity (tests/daemon/test_gate_api_key_daemon.py)."""

from __future__ import annotations

import pytest

from vllmwatch.gate import door, replay
from vllmwatch.testing import fake_api

KEY = "sk-GateParity0123456789"
OPEN_IN_VLLM = ("/score", "/rerank", "/pooling", "/classify", "/tokenize", "/detokenize")


def test_every_allow_listed_path_needs_the_key_at_one_of_the_two_unless_keyless() -> None:
    """The invariant, over the whole allow-list: a request with no key is refused by the gate
    or by vLLM, except on the liveness and monitoring paths vLLM leaves open too."""
    paths = set(replay.CLIENT_PATHS) | {"/v1/responses/resp_1", "/v1/responses/resp_1/cancel"}
    for path in sorted(paths):
        assert replay.allowed(path), path
        by_gate = door.key_refused("POST", path, None, KEY)
        by_vllm = fake_api.unauthorized("POST", path, None, KEY)
        if path in door.KEYLESS:
            assert not by_gate and not by_vllm, path
        else:
            assert by_gate != by_vllm, f"{path}: checked by neither, or by both"
    assert {p for p in replay.CLIENT_PATHS if door.key_refused("POST", p, None, KEY)} == \
        set(OPEN_IN_VLLM)
    assert door.VLLM_GUARDED == fake_api.GUARDED_PREFIX


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
    assert door.key_refused("POST", path, authorization, KEY) is refused
    assert fake_api.unauthorized("POST", "/v1/embeddings", authorization, KEY) is refused


def test_no_key_set_options_and_keyless_paths_pass() -> None:
    for path in OPEN_IN_VLLM:
        assert not door.key_refused("POST", path, None, None)
        assert not door.key_refused("POST", path, None, "")  # an empty key is none, as vLLM's
        assert not door.key_refused("OPTIONS", path, None, KEY)  # CORS preflight: vLLM's :50
    for path in door.KEYLESS:
        assert not door.key_refused("GET", path, None, KEY)


def test_a_header_with_bytes_that_are_not_utf8_is_refused_not_raised() -> None:
    """aiohttp gives undecodable header bytes as surrogates: refused, never a traceback."""
    assert door.key_refused("POST", "/pooling", "Bearer \udcff\udcfe", KEY)
