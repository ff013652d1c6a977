"""The gate never forwards vLLM's LoRA admin paths from clients (issue 38): adapters are
vllmwatch's to restore after a restart. The gate's allow-list of client paths (gate/replay.py,
issue 34) leaves them out; this holds it to that for every spelling, against the fake vLLM
with runtime updating on, so a forwarded load would succeed: the refusal is the gate's."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import pytest

from tests.shell.test_gate import Switch, fake_vllm, gate
from tests.support import TIMEOUT_SCALE, free_port
from tests.support.tinylora import make
from vllmwatch.gate.door import Readiness
from vllmwatch.gate.replay import allowed


def send(port: int, method: str, path: str, body: object = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20 * TIMEOUT_SCALE)
    try:
        conn.request(method, path, None if body is None else json.dumps(body),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("path", [
    "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/load_lora_adapter/",
    "//v1//load_lora_adapter", "/V1/Load_LoRA_Adapter", "/adapters", "/adapters/sql",
])
def test_every_spelling_of_the_admin_paths_is_refused(path: str) -> None:
    assert not allowed(path)


def test_a_client_load_through_the_gate_is_refused_and_never_reaches_vllm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")  # the fake inherits it
    adapter = str(make(tmp_path / "a"))
    port = free_port()
    with fake_vllm(port, "--enable-lora"), gate(port, Switch(Readiness.OPEN)) as g:
        body = {"lora_name": "x", "lora_path": adapter}
        status, answer = send(g.port, "POST", "/v1/load_lora_adapter", body)
        assert status == 404 and b"not a client API path" in answer
        for method, path in (("POST", "/v1/unload_lora_adapter"), ("POST", "/adapters"),
                             ("DELETE", "/adapters/x"), ("POST", "/v1/load%5Flora%5Fadapter")):
            assert send(g.port, method, path, body)[0] == 404, path
        models = json.loads(send(g.port, "GET", "/v1/models")[1])
        assert [m["id"] for m in models["data"]] == ["fake"]  # nothing was loaded
        assert g.stats.forwarded == 1 and g.stats.path_refused == 5  # the model list only
        # the fake itself would have taken it: the refusal is the gate's
        assert send(port, "POST", "/v1/load_lora_adapter", body)[0] == 200
