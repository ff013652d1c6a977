"""HTTP over a Unix socket: the spare's private endpoints (shell/sparetree.py), which listen
on a socket in vllmwatch's runtime directory and never on a port another user can reach."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Mapping


class _Uds(http.client.HTTPConnection):
    """HTTP over the spare's Unix socket."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def call(path: str, method: str, url: str, body: Mapping[str, object] | None = None,
         timeout: float = 5.0, api_key: str | None = None) -> tuple[int, bytes]:
    """One request to the spare; (status, body). OSError/HTTPException on no answer.
    `api_key`: vLLM's key guards /v1 (the canary), not the dev paths."""
    conn = _Uds(path, timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data else {}
        headers.update({"Authorization": f"Bearer {api_key}"} if api_key else {})
        conn.request(method, url, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(1 << 20)
    finally:
        conn.close()
