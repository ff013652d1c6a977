"""One HTTP/1.1 request read off a raw socket, for tests whose upstream plays vLLM byte by
byte (the gate's tests): the head, then a body of its Content-Length."""

from __future__ import annotations

import socket


def read_request(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """(head, body) of the next request; None when the peer closed before a whole head."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += sock.recv(65536)
    return head, body
