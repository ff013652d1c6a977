"""A fake ``vllm serve`` for fast fault-injection tests; stdlib only, Linux.

An API server spawns a ``VLLM::EngineCore`` child (and ``VLLM::Worker_TP{i}`` grandchildren)
in its own process group and serves completions through it, so stopping or killing the
engine looks to a supervisor as it does with real vLLM. Fault flags: see ``parse_args``.
This module is the API server and the one entry point for all roles; the engine and worker
roles live in ``vllmwatch.testing.fake_engine``, the API server's side of the engine link in
``vllmwatch.testing.fake_api``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socketserver
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any, NoReturn

if not __spec__:  # run by file path: make our package importable from the folder above it
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vllmwatch.testing import fake_lora, fake_sleep, fake_smoke
from vllmwatch.testing.fake_api import (
    ENGINE_DEAD_BODY,
    ENGINE_DEAD_ERROR,
    ENGINE_DEAD_EVENT,
    GENERATE,
    Api,
    error,
    routes,
    sse_events,
    unauthorized,
    write_stream,
)
from vllmwatch.testing.fake_engine import (
    CHILD_EXTRA,
    after,
    emit,
    engine_main,
    leak,
    log,
    spawn,
    worker_main,
    write_traceback,
)

VERSION = "0.0.0+fake"  # what `--version` and the start-up log say
# How children run this module again: -m when we were run so, as a script this file's folder
# would shadow stdlib modules; else by file path.
_ENTRY = ["-m", __spec__.name] if __spec__ else [os.path.abspath(__file__)]


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the flags the fake knows (times in s from ready); other flags are ignored."""
    p = argparse.ArgumentParser(prog="vllm serve", allow_abbrev=False)
    p.add_argument("--model", default="facebook/opt-125m")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"))
    p.add_argument("--leak-in", choices=("api", "engine"), default="api")
    # --arm-file: the *-after delays count from its touch (FaultClock); --hold-start-until,
    # --hold-bind-until: the engine's start, the port's bind (vLLM's: after its imports) wait
    # for the file; --crash-on-prompt: a prompt holding it crashes the engine (gate quarantine)
    for name in ("arm-file", "hold-start-until", "hold-bind-until", "crash-on-prompt"):
        p.add_argument(f"--{name}")
    p.add_argument("--workers", type=int, help="TP workers (default: TP size if > 1, else 0)")
    for name, number in (("port", 8000), ("tensor-parallel-size", 1), ("max-num-seqs", 256),
                         ("exit-code", 0), ("fd", -1), ("rank", 0),
                         # a stream cut (no end) after this many tokens: fake_api.write_stream
                         ("cut-stream-after", -1)):
        p.add_argument(f"--{name}", type=int, default=number)
    for name, seconds in (("startup-seconds", 0.5), ("engine-death-exit-delay", 3.0),
                          ("orphan-timeout", 120.0), ("slow-completion", 0.0),
                          ("leak-mib-per-s", 0.0), ("shutdown-timeout", 0.0),
                          ("stream-interval", 0.01),  # between SSE chunks of stream=true
                          # with more than one request running, each takes this long (load)
                          ("slow-when-busy", 0.0),
                          # with the engine dead, /health hangs this long, then the connection
                          # drops (vLLM 0.26 with --api-server-count 2, seen on the H200)
                          ("health-stall-after-engine-death", 0.0)):
        p.add_argument(f"--{name}", type=float, default=seconds)
    # --wedge-api-after: completions never return while /metrics says requests run and
    # tokens grow (an API server wedged while its engine works; issue 37.8)
    for name in ("hang-after", "deadlock-after", "wedge-api-after", "stall-after",
                 "exit-after", "engine-crash-after", "crash-during-start", "health-fail-after",
                 "unhealthy-after"):
        p.add_argument(f"--{name}", type=float)
    for name in ("busy", "ignore-sigterm", "fail-start", "disable-uvicorn-access-log",
                 # once ready, start a descendant that calls setsid and clears its environment
                 # (no marker), as a daemonizing helper would; -holds-port: it inherits the
                 # listening socket, so it keeps vLLM's port after the server is gone
                 "spawn-setsid-orphan", "setsid-orphan-holds-port"):
        p.add_argument(f"--{name}", action="store_true")
    fake_smoke.add_args(p)  # tool parser, chat template, /v1/messages (smoke checks)
    p.add_argument("--role", choices=("api", "engine", "worker"), default="api")
    # A pooling model has no completion routes (vLLM registers only its tasks' routes).
    p.add_argument("--runner", choices=("auto", "generate", "pooling"), default="auto")
    p.add_argument("--convert", choices=("auto", "none", "embed", "classify"), default="auto")
    # The model itself says pooling (sentence-transformers modules.json): no flag shows it.
    p.add_argument("--fake-embedding-model", action="store_true")
    fake_sleep.add_args(p)  # sleep mode, GPU memory, --uds (issue 34)
    fake_lora.add_args(p)
    return p.parse_known_args(argv)[0]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 2048  # uvicorn's backlog; socketserver's 5 refuses bursts of clients
    api: Api

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up on a slow reply are normal here; stay quiet."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _send(self, code: int, reply: Any, ctype: str = "application/json") -> None:
        body = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
        if reply is ENGINE_DEAD_ERROR:
            body = ENGINE_DEAD_BODY  # byte for byte what vLLM sends (fake_api.py)
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        """Serve /health, /v1/models and /metrics."""
        api, path = self.server.api, self.path.split("?")[0]
        dev = api.sleep.get(path)
        if unauthorized("GET", path, self.headers.get("Authorization"), api.args.api_key):
            self._send(401, {"error": "Unauthorized"})  # vLLM's middleware (fake_api)
        elif dev is not None:
            self._send(*dev)
        elif path == "/health":
            stall = api.args.health_stall_after_engine_death
            if api.dead_at is not None and stall > 0:
                time.sleep(stall)
                self.close_connection = True  # no answer: the client sees the socket close
                return
            self._send(api.health(), b"")
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [
                {"id": n, "object": "model", "created": 0, "owned_by": "vllm",
                 "root": api.args.model, "parent": None, "max_model_len": 2048}
                for n in api.names] + api.loras.models(api.names[0])})
        elif path == "/metrics":
            self._send(200, api.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        """Serve the completion routes, or a pooling model's routes (--runner pooling)."""
        with self.server.api.serving():
            self._post(self.server.api)

    def _post(self, api: Api) -> None:
        path, _, query = self.path.partition("?")
        if unauthorized("POST", path, self.headers.get("Authorization"), api.args.api_key):
            return self._send(401, {"error": "Unauthorized"})  # vLLM's middleware, before any route
        dev = api.sleep.post(path, query)  # dev mode: not guarded by the API key, as vLLM's
        if dev is not None:
            return self._send(*dev)
        if path in fake_lora.ROUTES and api.loras.runtime:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            code, answer = api.loras.post(path, body, api.names) or (404, {})
            ctype = "text/plain; charset=utf-8" if isinstance(answer, bytes) else \
                "application/json"
            return self._send(code, answer, ctype)
        if path not in routes(api.args):
            return self._send(404, {"detail": "Not Found"})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return self._send(400, error("Invalid JSON body", "BadRequestError", 400))
        smoke = fake_smoke.answer(api.args, path, body, api.complete)
        if smoke is not None:  # tools, /v1/messages (streamed: its events), no chat template
            return self._send(*smoke) if isinstance(smoke[1], dict) else write_stream(
                self, smoke[1], api.args.stream_interval, api.args.cut_stream_after)
        if path not in GENERATE:
            return self._send(*api.pool(body, path))
        code, reply = api.complete(body, chat=path.endswith("chat/completions"))
        if reply is ENGINE_DEAD_ERROR and body.get("stream"):  # the engine died before the
            # first token: as vLLM sends it, the 200 head, the error event, [DONE] (fake_api)
            return write_stream(self, [ENGINE_DEAD_EVENT], 0.0, -1)
        if code == 200 and body.get("stream"):
            return self._stream(reply)
        self._send(code, reply)

    def _stream(self, reply: dict[str, Any]) -> None:
        """Send the finished reply as SSE, one token a chunk, like vLLM with stream=true."""
        a = self.server.api.args
        write_stream(self, sse_events(reply), a.stream_interval, a.cut_stream_after)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Log accesses like uvicorn does, unless --disable-uvicorn-access-log."""
        if not self.server.api.args.disable_uvicorn_access_log:
            host, port = self.client_address[:2] if isinstance(self.client_address, tuple) \
                else ("unix", 0)
            emit(f'INFO:     {host}:{port} - "{self.requestline}" {code}')

    def log_message(self, *args: Any, **kwargs: Any) -> None:
        """Silence http.server's own stderr lines."""


class _Stop(BaseException):
    """Raised by the SIGTERM/SIGINT handler to unwind the API server's main thread."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def _shutdown(engine: subprocess.Popen[bytes] | None, api: Api | None, code: int,
              drain: float | None = None) -> NoReturn:
    """Drain if asked (--shutdown-timeout), stop the engine and its workers, exit ``code``;
    `drain` None: not stopped by a signal (vLLM's handler line is for signals only)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    if api is not None:
        api.stopping, deadline = True, time.monotonic() + (drain or 0.0)
        if drain is not None:  # 0.32's signal handler
            log("INFO", "[shutdown] API server: shutdown triggered", "launcher.py:254")
        while api.pending and api.dead_at is None and time.monotonic() < deadline:
            time.sleep(0.02)
    log("INFO", "Shutting down", "launcher.py:1")
    if engine is not None:
        engine.terminate()
        try:
            engine.wait(0.4)
        except subprocess.TimeoutExpired:
            engine.kill()
            engine.wait()
    deadline = time.monotonic() + 2.0  # vLLM's uvicorn sends the aborted requests' answers
    while api is not None and api.answering and time.monotonic() < deadline:  # before exit
        time.sleep(0.02)
    log("INFO", "Application shutdown complete.", "launcher.py:2")
    os._exit(code)


def _watch(a: argparse.Namespace, api: Api) -> int:
    """Tick until --exit-after fires or the engine has been dead long enough; the exit code."""
    while True:
        time.sleep(0.05)
        now = time.monotonic()
        if api.faults.age() >= after(a.exit_after):
            log("WARNING", f"Injected fault: exit with code {a.exit_code} (--exit-after)")
            return int(a.exit_code)
        if api.dead_at is not None and now - api.dead_at >= a.engine_death_exit_delay:
            return 0


# The setsid'd descendant: holds the inherited fd (if any) and sleeps for --orphan-timeout.
_ORPHAN = "import sys, time; time.sleep(float(sys.argv[2]))"
ORPHAN_TAG = "vllmwatch-fake-setsid-orphan"  # in its argv, for tests to find it


def _setsid_orphan(a: argparse.Namespace, server: socketserver.TCPServer) -> None:
    fds = (server.socket.fileno(),) if a.setsid_orphan_holds_port else ()
    proc = subprocess.Popen([sys.executable, "-c", _ORPHAN, ORPHAN_TAG, str(a.orphan_timeout),
                             str(a.port)], env={}, start_new_session=True, pass_fds=fds,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    log("INFO", f"setsid orphan started: pid {proc.pid}", "fake.py:1")


def api_main(a: argparse.Namespace, flags: list[str]) -> int:
    """The API server: start the engine, wait for it, serve HTTP, exit like vLLM."""
    if a.fail_start:
        sys.stderr.write("usage: vllm serve [model_tag] [options]\n"
                         "vllm: error: unrecognized arguments: --fail-start\n")
        return 2
    if a.fake_cpu and a.enable_sleep_mode:
        write_traceback("ValueError: Sleep mode is not supported on current platform.",
                        "vllm/config/model.py")
        return 1
    log("INFO", f"vLLM API server version {VERSION}", "api_server.py:1")
    log("INFO", f"non-default args: {{'model': '{a.model}', 'port': {a.port}}}", "utils.py:1")
    engine, api = None, None
    signal.signal(signal.SIGTERM, signal.SIG_IGN if a.ignore_sigterm else _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    try:
        server: _Server | fake_sleep.UnixServer = _Server((a.host, a.port), _Handler,
            False) if not a.uds else fake_sleep.UnixServer(a.uds, _Handler, False)
        while a.hold_bind_until and not os.path.exists(a.hold_bind_until):
            time.sleep(0.05)  # pacing: a file poll (the imports vLLM does before its bind)
        try:
            server.server_bind()  # like vLLM: take the port before the engine starts
        except OSError as exc:
            write_traceback(f"OSError: [Errno {exc.errno}] {exc.strerror}", "launcher.py")
            return 1
        engine, sock = spawn(_ENTRY, "VLLM::EngineCore", "engine", flags)
        memory = fake_sleep.Memory(a)
        memory.pid = engine.pid
        server.api = api = Api(sock, a)
        api.sleep = fake_sleep.Sleep(a, api, memory)
        if memory.refuse_start(engine):  # vLLM's request_memory(), in the engine's init
            return 1
        rfile = sock.makefile("rb")
        if not rfile.readline():
            write_traceback("RuntimeError: Engine core initialization failed. See root cause "
                            f"above. Failed core proc(s): {{'EngineCore_DP0': {engine.wait()}}}",
                            "vllm/entrypoints/openai/api_server.py")
            return 1
        refused = api.loras.load_static(log)  # vLLM's init_static_loras
        if refused is not None:
            write_traceback(refused, "vllm/entrypoints/openai/models/serving.py")
            _shutdown(engine, api, 1)
        memory.hold(memory.awake_mib())
        where = f"unix:{a.uds}" if a.uds else f"http://{a.host}:{a.port}"
        log("INFO", f"Starting vLLM server on {where}", "api_server.py:2")
        server.server_activate()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        threading.Thread(target=api.read_loop, args=(rfile,), daemon=True).start()
        for msg in (f"Started server process [{os.getpid()}]", "Waiting for application "
                    "startup.", "Application startup complete."):
            log("INFO", msg, "launcher.py:1")
        api.faults.ready()
        if a.spawn_setsid_orphan:
            _setsid_orphan(a, server)
        leak(a, "api", api.faults)
        _shutdown(engine, api, _watch(a, api))
    except _Stop:
        _shutdown(engine, api, 0, a.shutdown_timeout)


def main(argv: list[str] | None = None) -> int:
    """Entry point for all three roles: API server, engine, worker."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[-1:] == ["--version"]:  # `vllm --version`, as the real one answers it
        print(VERSION)
        return 0
    a = parse_args(argv)
    if a.role == "engine":
        return engine_main(a, argv[:-CHILD_EXTRA], _ENTRY)
    return worker_main(a) if a.role == "worker" else api_main(a, argv)


if __name__ == "__main__":
    sys.exit(main())
