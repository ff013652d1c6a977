"""The gate's API key check (gate/apikey.py key_refused) against real vLLM 0.32's own middleware
(vllm/entrypoints/serve/middleware/authenticate.py), run in the real vLLM's venv: for every
allow-listed path, method and Authorization header below, vLLM refuses it or the gate does
(never both, never neither) unless the path is keyless in both, and each decides a header the
same way. The fake's model of the middleware (fake_api.unauthorized) is checked beside it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support import REPO

CHECK = r'''
import asyncio
from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware
from vllmwatch.gate import apikey, replay
from vllmwatch.testing import fake_api

KEY = "sk-Parity123"
AUTHS = [None, "", "Bearer", "Bearer ", "Bearer wrong", "Basic " + KEY, "Bearer " + KEY + " ",
         "Bearer  " + KEY, "Bearer " + KEY, "bearer " + KEY, "BEARER " + KEY]


async def app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})

vllm = AuthenticationMiddleware(app, [KEY])


async def refuses(method, path, auth):
    headers = [] if auth is None else [(b"authorization", auth.encode("latin-1"))]
    got = []

    async def send(message):
        if message["type"] == "http.response.start":
            got.append(message["status"])

    async def receive():
        return {"type": "http.request", "body": b""}
    await vllm({"type": "http", "method": method, "path": path, "root_path": "",
                "headers": headers}, receive, send)
    return got[0] == 401


async def main():
    wrong = []
    for path in sorted(replay.CLIENT_PATHS) + ["/v1/responses/r1"]:
        for method in ("POST", "GET", "OPTIONS"):
            for auth in AUTHS:
                by_vllm = await refuses(method, path, auth)
                by_gate = apikey.key_refused(method, path, auth, KEY)
                as_vllm = await refuses(method, "/v1/models", auth)
                fake = fake_api.unauthorized(method, path, auth, KEY)
                ok = fake == by_vllm and (not by_gate if path in apikey.KEYLESS or
                                          path.startswith(apikey.VLLM_GUARDED)
                                          else not by_vllm and by_gate == as_vllm)
                if not ok:
                    wrong.append((method, path, auth, by_vllm, by_gate, fake))
    print("WRONG", wrong)

asyncio.run(main())
'''


def test_the_gate_decides_the_key_as_real_vllm_does(vllm_venv: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([str(vllm_venv / "bin" / "python"), "-c", CHECK], env=env,
                          capture_output=True, text=True, timeout=300, cwd=str(REPO))
    assert done.returncode == 0, done.stderr[-4000:]
    assert "WRONG []" in done.stdout, done.stdout[-4000:]
