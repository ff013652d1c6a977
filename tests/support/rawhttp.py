"""One HTTP/1.1 request read off a raw socket, for tests whose upstream plays vLLM byte by
byte (the gate's tests): the head, then a body of its Content-Length."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

from vllmwatch.testing.waiting import TIMEOUT_SCALE


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


@contextmanager
def raw_upstream(answer: Callable[[socket.socket, int], None]
                 ) -> Iterator[tuple[int, list[bytes]]]:
    """A vLLM stand-in on a raw socket: (its port, the heads it read). Each request, one per
    connection, is read whole and `answer(conn, n)` writes what it likes (n counts from 1;
    writing nothing closes the connection unanswered)."""
    srv = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(30 * TIMEOUT_SCALE)
                got = read_request(conn)
                if got is not None:
                    seen.append(got[0])
                    answer(conn, len(seen))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1], seen
    finally:
        with suppress(OSError):
            srv.shutdown(socket.SHUT_RDWR)  # wakes its accept(); close() alone does not
        srv.close()
        thread.join(10 * TIMEOUT_SCALE)
        assert not thread.is_alive()
