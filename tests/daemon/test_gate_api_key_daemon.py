"""The real daemon, its gate on, over the fake vLLM (which checks the key as vLLM 0.32's
middleware does: only under /v1, /v2, /inference, /cohere; fake_api.unauthorized) serving a
pooling model, with vllm.api_key_file set. Before, POST /pooling through the gate ran the
model for a client with no key or a wrong one (200): vLLM does not guard it, the gate passed
it on. Now the gate asks for the key there as vLLM asks under its prefixes, /health and
/metrics stay open as in vLLM, and a key file rotated in place and reloaded (SIGHUP) takes
effect at the gate with the relaunched engine. The key never reaches a log line."""

from __future__ import annotations

import json
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import TIMEOUT_SCALE, Daemon, base_config, free_port, merge

OLD, NEW = "sk-GateKeyOld13579abc", "sk-GateKeyNew24680xyz"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    (tmp_path / "key").write_text(OLD + "\n")
    (tmp_path / "key").chmod(0o600)
    cfg = merge(base_config(free_port(), free_port()), {
        "vllm": {"api_key_file": str(tmp_path / "key"), "args": {"runner": "pooling"}},
        "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}"}})
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", cfg)
    try:
        yield d.start()
    finally:
        d.close()


def _code(port: int, method: str, path: str, key: str | None,
          timeout: float = 20.0 * TIMEOUT_SCALE) -> int:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps({"model": "tiny", "input": "hi"}).encode() if method == "POST" else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, data=data,
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        if exc.code == 401:  # vLLM's own shape, from whichever of the two refused it
            assert json.loads(exc.read()) == {"error": "Unauthorized"}
        return int(exc.code)


def _codes(port: int, key: str) -> dict[str, list[int]]:
    """No key, a wrong one, the right one, on each class of path."""
    paths = {"open in vLLM": ("POST", "/pooling"), "vLLM's": ("POST", "/v1/embeddings"),
             "keyless": ("GET", "/health")}
    return {name: [_code(port, m, p, k) for k in (None, "sk-wrong", key)]
            for name, (m, p) in paths.items()}


def test_the_gate_asks_for_the_key_where_vllm_does_not(daemon: Daemon, tmp_path: Path) -> None:
    d = daemon
    first = d.wait_ready(60.0)
    gate = int(d.config["gate"]["listen"].rsplit(":", 1)[1])
    assert _code(d.port, "POST", "/pooling", None) == 200  # vLLM itself leaves it open
    assert _codes(gate, OLD) == {"open in vLLM": [401, 401, 200], "vLLM's": [401, 401, 200],
                                 "keyless": [200, 200, 200]}
    assert _code(gate, "GET", "/metrics", None) == 200
    (tmp_path / "key").write_text(NEW + "\n")  # rotated in place, then reloaded
    since = d.mark()
    d.signal(signal.SIGHUP)
    begin = d.wait_event("restart.begin", 15.0, since, reason="reload")
    ready = d.wait_ready(30.0, since=d.events.index(begin))
    assert ready["pid"] != first["pid"]
    assert _codes(gate, NEW) == {"open in vLLM": [401, 401, 200], "vLLM's": [401, 401, 200],
                                 "keyless": [200, 200, 200]}
    assert _code(gate, "POST", "/pooling", OLD) == 401
    said = json.dumps(d.events) + "\n".join(d.raw)
    assert OLD not in said and NEW not in said


def test_a_held_request_with_the_old_key_is_refused_at_the_relaunch_not_at_its_ready(
        tmp_path: Path) -> None:
    """The relaunch for a rotated key starts and stays starting (the fake's start waits for a
    file): a request with the old key gets its 401 at the launch, not when vLLM is READY (it
    waited until then, or until gate.hold_timeout's 503); the new key waits, and is served."""
    go = tmp_path / "start.go"
    go.touch()
    (tmp_path / "key").write_text(OLD + "\n")
    (tmp_path / "key").chmod(0o600)
    cfg = merge(base_config(free_port(), free_port(), ["--hold-start-until", str(go)]), {
        "vllm": {"api_key_file": str(tmp_path / "key"), "args": {"runner": "pooling"}},
        "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}"}})
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", cfg)
    try:
        d.start()
        d.wait_ready(60.0)
        gate = int(cfg["gate"]["listen"].rsplit(":", 1)[1])
        go.unlink()  # the relaunch's start waits from now on
        (tmp_path / "key").write_text(NEW + "\n")
        since = d.mark()
        d.signal(signal.SIGHUP)
        d.wait_event("child.started", 30.0, since)
        served: list[int] = []
        new = threading.Thread(target=lambda: served.append(
            _code(gate, "POST", "/v1/embeddings", NEW, timeout=120.0 * TIMEOUT_SCALE)), daemon=True)
        new.start()
        assert _code(gate, "POST", "/v1/embeddings", OLD) == 401  # (old code: a timeout)
        assert _code(gate, "POST", "/pooling", None) == 401
        assert not served, "the new key was answered before its engine was READY"
        go.touch()
        new.join(130.0 * TIMEOUT_SCALE)
        assert served == [200]
    finally:
        d.close()
