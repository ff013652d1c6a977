"""A stand-in for `vllm serve` that answers 200 with one fixed body to every request: what a
wrong server, a proxy's error page or a broken route looks like. Run by path:
`python stub_vllm.py --body-file FILE --port N [ignored vLLM flags]`."""

from __future__ import annotations

import argparse
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> int:
    """Serve until killed."""
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--body-file", required=True)
    a = p.parse_known_args(argv)[0]
    body = Path(a.body_file).read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            """Quiet."""

    print("Application startup complete.", flush=True)
    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
