"""A fake ``vllm serve`` for fast fault-injection tests; stdlib only, Linux.

An API server spawns a ``VLLM::EngineCore`` child (and ``VLLM::Worker_TP{i}`` grandchildren)
in its own process group and serves completions through it, so stopping or killing the
engine looks to a supervisor as it does with real vLLM. Fault flags: see ``parse_args``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any, BinaryIO, NoReturn

_OUT = threading.Lock()
_PREFIX = "APIServer"
_CHILD_EXTRA = 7  # argv items that _spawn appends after the user's flags
_BUSY_SEQS = 4  # synthetic sequences that --busy keeps running
_METRICS = [  # (name, type, help, key in the engine's stats)
    ("num_requests_running", "gauge", "Number of requests in model execution batches.", "run"),
    ("num_requests_waiting", "gauge", "Number of requests waiting to be processed.", "wait"),
    ("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", "kv"),
    ("prompt_tokens_total", "counter", "Number of prefill tokens processed.", "prompt"),
    ("generation_tokens_total", "counter", "Number of generation tokens processed.", "gen"),
    ("num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", ""),
]


def emit(text: str) -> None:
    """Write one ``(Role pid=N)``-prefixed line to stdout and flush; never raise."""
    with _OUT, contextlib.suppress(OSError, ValueError):
        sys.stdout.write(f"({_PREFIX} pid={os.getpid()}) {text}\n")
        sys.stdout.flush()


def log(level: str, msg: str, where: str = "fake_vllm.py:1") -> None:
    """Emit a vLLM-style line: ``INFO 11-29 17:00:00 [file.py:1] msg``."""
    emit(f"{level} {time.strftime('%m-%d %H:%M:%S')} [{where}] {msg}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the flags the fake knows (times in s from ready); other flags are ignored."""
    p = argparse.ArgumentParser(prog="vllm serve", allow_abbrev=False)
    p.add_argument("--model", default="facebook/opt-125m")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"))
    p.add_argument("--leak-in", choices=("api", "engine"), default="api")
    p.add_argument("--workers", type=int, help="TP workers (default: TP size if > 1, else 0)")
    for name, number in (("port", 8000), ("tensor-parallel-size", 1), ("max-num-seqs", 256),
                         ("exit-code", 0), ("fd", -1), ("rank", 0)):
        p.add_argument(f"--{name}", type=int, default=number)
    for name, seconds in (("startup-seconds", 0.5), ("engine-death-exit-delay", 3.0),
                          ("orphan-timeout", 120.0), ("slow-completion", 0.0),
                          ("leak-mib-per-s", 0.0), ("shutdown-timeout", 0.0)):
        p.add_argument(f"--{name}", type=float, default=seconds)
    for name in ("hang-after", "stall-after", "exit-after", "engine-crash-after",
                 "crash-during-start", "health-fail-after", "unhealthy-after"):
        p.add_argument(f"--{name}", type=float)
    for name in ("busy", "ignore-sigterm", "fail-start", "disable-uvicorn-access-log"):
        p.add_argument(f"--{name}", action="store_true")
    p.add_argument("--role", choices=("api", "engine", "worker"), default="api")
    return p.parse_known_args(argv)[0]


def _spawn(marker: str, role: str, flags: list[str], rank: int = 0
           ) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """Run this file as a child ``role`` (same process group), linked by a socketpair."""
    mine, theirs = socket.socketpair()
    # -m when we were run so: as a script, this file's folder would shadow stdlib modules
    entry = ["-m", __spec__.name] if __spec__ else [os.path.abspath(__file__)]
    argv = [sys.executable, *entry, *flags, marker,
            "--role", role, "--fd", str(theirs.fileno()), "--rank", str(rank)]
    proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),))
    theirs.close()
    return proc, mine


def _leak(a: argparse.Namespace, where: str) -> None:
    """Start a thread that grows RSS by --leak-mib-per-s, touching every page."""
    def grow(hoard: list[bytearray], due: float) -> None:
        while True:
            hoard.append(bytearray(b"\xa5") * int(a.leak_mib_per_s * 2**20 / 10))
            due += 0.1
            time.sleep(max(0.0, due - time.monotonic()))
    if a.leak_mib_per_s > 0 and a.leak_in == where:
        threading.Thread(target=grow, args=([], time.monotonic()), daemon=True).start()


def _traceback(error: str, where: str) -> None:
    sys.stderr.write(f'Traceback (most recent call last):\n  File "{where}", line 1, in run\n'
                     f"{error}\n")
    sys.stderr.flush()


def _after(seconds: float | None) -> float:
    """A fault delay, or never when the flag is unset (0 means at once)."""
    return math.inf if seconds is None else seconds


def _error(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": kind, "param": None, "code": code}


class Api:
    """API-server side of the engine link: pending requests, last engine stats, death."""

    def __init__(self, sock: socket.socket, args: argparse.Namespace) -> None:
        self.sock, self.args, self.names = sock, args, args.served_model_name or [args.model]
        self.lock = threading.Lock()
        self.pending: dict[int, tuple[threading.Event, list[int]]] = {}
        self.next_id, self.ready_at, self.stopping = 0, math.inf, False
        self.dead_at: float | None = None
        self.stats: dict[str, Any] = dict.fromkeys(("run", "wait", "kv", "prompt", "gen", "ok"), 0)

    def submit(self, prompt: int, max_tokens: int) -> int | None:
        """Queue one request on the engine and wait for it; None if the engine is gone."""
        event, box = threading.Event(), list[int]()
        with self.lock:
            if self.dead_at is not None or self.stopping:
                return None
            self.next_id += 1
            self.pending[self.next_id] = (event, box)
            msg = {"id": self.next_id, "prompt": prompt, "max": max_tokens}
            try:
                self.sock.sendall(json.dumps(msg).encode() + b"\n")
            except OSError:
                return None
        event.wait()
        return box[0] if box else None

    def read_loop(self, rfile: BinaryIO) -> None:
        """Apply engine stats and replies until EOF, then mark the engine dead."""
        with contextlib.suppress(OSError, ValueError):
            for msg in map(json.loads, rfile):
                if "done" not in msg:
                    self.stats = msg
                    continue
                with self.lock:
                    event, box = self.pending.pop(msg["done"], (threading.Event(), []))
                box.append(msg["tokens"])
                event.set()
        with self.lock:
            self.dead_at = time.monotonic()
            for event, _ in self.pending.values():
                event.set()
        if not self.stopping:
            log("ERROR", "Engine core proc EngineCore_DP0 died unexpectedly, shutting down "
                "client.", "core_client.py:1")

    def health(self) -> int:
        """Status code of GET /health."""
        a, age = self.args, time.monotonic() - self.ready_at
        if self.dead_at is not None or age >= _after(a.unhealthy_after):
            return 503
        return 500 if age >= _after(a.health_fail_after) else 200

    def metrics(self) -> str:
        """Prometheus text shaped like vLLM's /metrics (a small subset)."""
        s, lab = self.stats, f'engine="0",model_name="{self.names[0]}"'
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        out = ["# HELP process_resident_memory_bytes Resident memory size in bytes.",
               "# TYPE process_resident_memory_bytes gauge", f"process_resident_memory_bytes {rss}"]
        for name, kind, text, key in _METRICS:
            out += [f"# HELP vllm:{name} {text}", f"# TYPE vllm:{name} {kind}",
                    f"vllm:{name}{{{lab}}} {float(s.get(key, 0))}"]
        name = "vllm:request_success_total"
        out += [f"# HELP {name} Count of successfully processed requests.",
                f"# TYPE {name} counter"]
        out += [f'{name}{{{lab},finished_reason="{r}"}} {float(s["ok"] if r == "length" else 0)}'
                for r in ("stop", "length", "abort")]
        return "\n".join(out) + "\n"

    def complete(self, body: dict[str, Any], chat: bool) -> tuple[int, dict[str, Any]]:
        """Run an OpenAI (chat) completion through the engine: (status, JSON reply)."""
        model = body.get("model") or self.names[0]
        if model not in self.names:
            return 404, _error(f"The model `{model}` does not exist.", "NotFoundError", 404)
        text = (" ".join(str(m.get("content", "")) for m in body.get("messages", [])) if chat
                else str(body.get("prompt", "")))
        prompt = max(1, len(text.split()))
        got = self.submit(prompt, int(body.get("max_tokens") or 16))
        if got is None and self.stopping:
            return 503, _error("The server is shutting down.", "ServiceUnavailableError", 503)
        if got is None:
            return 500, _error("EngineCore encountered an issue. See stack trace for the root "
                               "cause.", "InternalServerError", 500)
        out = " ".join(["fake"] * got)
        choice = {"index": 0, "finish_reason": "length", "logprobs": None,
                  **({"message": {"role": "assistant", "content": out}} if chat else {"text": out})}
        usage = {"prompt_tokens": prompt, "completion_tokens": got, "total_tokens": prompt + got}
        return 200, {"id": f"cmpl-{time.monotonic_ns()}", "model": model, "choices": [choice],
                     "object": "chat.completion" if chat else "text_completion",
                     "created": int(time.time()), "usage": usage}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    api: Api

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up on a slow reply are normal here; stay quiet."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _send(self, code: int, reply: Any, ctype: str = "application/json") -> None:
        body = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        """Serve /health, /v1/models and /metrics."""
        api, path = self.server.api, self.path.split("?")[0]
        if path == "/health":
            self._send(api.health(), b"")
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [
                {"id": n, "object": "model", "created": 0, "owned_by": "vllm",
                 "root": api.args.model, "parent": None, "max_model_len": 2048}
                for n in api.names]})
        elif path == "/metrics":
            self._send(200, api.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        """Serve /v1/completions and /v1/chat/completions."""
        api, path = self.server.api, self.path.split("?")[0]
        key = api.args.api_key
        if path not in ("/v1/completions", "/v1/chat/completions"):
            return self._send(404, {"detail": "Not Found"})
        if key and self.headers.get("Authorization") != f"Bearer {key}":
            return self._send(401, {"error": "Unauthorized"})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return self._send(400, _error("Invalid JSON body", "BadRequestError", 400))
        self._send(*api.complete(body, chat=path.endswith("chat/completions")))

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Log accesses like uvicorn does, unless --disable-uvicorn-access-log."""
        if not self.server.api.args.disable_uvicorn_access_log:
            host, port = self.client_address[:2]
            emit(f'INFO:     {host}:{port} - "{self.requestline}" {code}')

    def log_message(self, *args: Any, **kwargs: Any) -> None:
        """Silence http.server's own stderr lines."""


class _Stop(BaseException):
    """Raised by the SIGTERM/SIGINT handler to unwind the API server's main thread."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def _shutdown(engine: subprocess.Popen[bytes] | None, api: Api | None, code: int,
              drain: float = 0.0) -> NoReturn:
    """Drain if asked (--shutdown-timeout), stop the engine and its workers, exit ``code``."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    if api is not None:
        api.stopping, deadline = True, time.monotonic() + drain
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
    log("INFO", "Application shutdown complete.", "launcher.py:2")
    os._exit(code)


def _watch(a: argparse.Namespace, api: Api) -> int:
    """Tick until --exit-after fires or the engine has been dead long enough; the exit code."""
    while True:
        time.sleep(0.05)
        now = time.monotonic()
        if now - api.ready_at >= _after(a.exit_after):
            log("WARNING", f"Injected fault: exit with code {a.exit_code} (--exit-after)")
            return int(a.exit_code)
        if api.dead_at is not None and now - api.dead_at >= a.engine_death_exit_delay:
            return 0


def api_main(a: argparse.Namespace, flags: list[str]) -> int:
    """The API server: start the engine, wait for it, serve HTTP, exit like vLLM."""
    if a.fail_start:
        sys.stderr.write("usage: vllm serve [model_tag] [options]\n"
                         "vllm: error: unrecognized arguments: --fail-start\n")
        return 2
    log("INFO", "vLLM API server version 0.0.0+fake", "api_server.py:1")
    log("INFO", f"non-default args: {{'model': '{a.model}', 'port': {a.port}}}", "utils.py:1")
    engine, api = None, None
    signal.signal(signal.SIGTERM, signal.SIG_IGN if a.ignore_sigterm else _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    try:
        server = _Server((a.host, a.port), _Handler, bind_and_activate=False)
        server.server_bind()  # like vLLM: take the port before the engine starts
        engine, sock = _spawn("VLLM::EngineCore", "engine", flags)
        server.api = api = Api(sock, a)
        rfile = sock.makefile("rb")
        if not rfile.readline():
            _traceback("RuntimeError: Engine core initialization failed. See root cause above. "
                       f"Failed core proc(s): {{'EngineCore_DP0': {engine.wait()}}}",
                       "vllm/entrypoints/openai/api_server.py")
            return 1
        log("INFO", f"Starting vLLM server on http://{a.host}:{a.port}", "api_server.py:2")
        server.server_activate()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        threading.Thread(target=api.read_loop, args=(rfile,), daemon=True).start()
        for msg in (f"Started server process [{os.getpid()}]", "Waiting for application "
                    "startup.", "Application startup complete."):
            log("INFO", msg, "launcher.py:1")
        api.ready_at = time.monotonic()
        _leak(a, "api")
        _shutdown(engine, api, _watch(a, api))
    except _Stop:
        _shutdown(engine, api, 0, a.shutdown_timeout)


@dataclass
class _Req:
    id: int
    prompt: int
    max_tokens: int
    done: int = 0
    start: float = 0.0


class Engine:
    """EngineCore: admits requests, makes tokens, reports stats; engine faults live here."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a, self.api = a, socket.socket(fileno=a.fd)
        self.workers: list[tuple[subprocess.Popen[bytes], socket.socket]] = []
        self.waiting: list[_Req] = []
        self.running: list[_Req] = []
        self.prompt = self.gen = self.ok = 0
        self.buf, self.sent_at = b"", 0.0
        self.orphan_at: float | None = None

    def on_term(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM: stop the workers, then exit 0."""
        for proc, _ in self.workers:
            proc.terminate()
        for proc, _ in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.3)
            proc.kill()
        os._exit(0)

    def start(self, flags: list[str], workers: int) -> None:
        """Spawn workers and print the startup milestones over --startup-seconds."""
        a, s = self.a, self.a.startup_seconds
        self.workers = [_spawn(f"VLLM::Worker_TP{i}", "worker", flags, i) for i in range(workers)]
        lines = [("gpu_model_runner.py:1", f"Starting to load model {a.model}..."),
                 ("default_loader.py:1", f"Loading weights took {s * 0.2:.2f} seconds"),
                 ("gpu_model_runner.py:2", f"Model loading took 0.1 GiB and {s * 0.3:.2f} sec"),
                 ("monitor.py:1", f"torch.compile took {s * 0.2:.2f} s in total"),
                 ("gpu_worker.py:1", "Available KV cache memory: 1.0 GiB"),
                 ("gpu_model_runner.py:3", "Capturing CUDA graphs (decode, FULL): 100%"),
                 ("gpu_model_runner.py:4", "Graph capturing finished in 1 secs, took 0.05 GiB"),
                 ("core.py:1", f"init engine (profile, create kv cache, warmup model) took "
                  f"{s:.2f} seconds")]
        t0 = time.monotonic()
        crash_at = t0 + _after(a.crash_during_start)
        for i, (where, msg) in enumerate(lines):
            log("INFO", msg, where)
            time.sleep(max(0.0, min(t0 + s * (i + 1) / len(lines), crash_at) - time.monotonic()))
            if time.monotonic() >= crash_at:
                break
        if crash_at < math.inf:
            time.sleep(max(0.0, crash_at - time.monotonic()))
            self.crash("EngineCore failed to start.", "injected crash (--crash-during-start)")
        if not all(sock.recv(1) for _, sock in self.workers):  # each says "ready" once
            self.crash("EngineCore failed to start.", "a worker died during startup")

    def crash(self, msg: str, why: str) -> NoReturn:
        """Log an engine error with a traceback-like message and exit 1."""
        log("ERROR", msg, "core.py:2")
        _traceback(f"RuntimeError: {why}", "vllm/v1/engine/core.py")
        os._exit(1)

    def run(self) -> NoReturn:
        """Serve requests until a fault, SIGTERM, or the end of an orphanhood."""
        a, ready, stalled = self.a, time.monotonic(), False
        self.send([])  # the first message tells the API server we are ready
        _leak(a, "engine")
        while True:
            age = time.monotonic() - ready
            if age >= _after(a.engine_crash_after):
                self.crash("EngineCore encountered a fatal error.", "injected crash "
                           "(--engine-crash-after)")
            if age >= _after(a.hang_after):
                log("WARNING", "Injected fault: engine hang (--hang-after)")
                while True:
                    time.sleep(3600)
            if time.monotonic() - _after(self.orphan_at) >= a.orphan_timeout:
                os._exit(0)
            if not stalled and age >= _after(a.stall_after):
                stalled = True
                log("WARNING", "Injected fault: engine stall (--stall-after)")
            self.receive(0.01 if self.running or self.waiting or a.busy else 0.05)
            done = [] if stalled else self.step(time.monotonic())
            if done or time.monotonic() - self.sent_at >= 0.1:
                self.send(done)

    def receive(self, timeout: float) -> None:
        """Queue new requests from the API server; notice when it is gone."""
        if self.orphan_at is not None or not select.select([self.api], [], [], timeout)[0]:
            time.sleep(timeout if self.orphan_at is not None else 0)
            return
        try:
            data = self.api.recv(65536)
        except OSError:
            data = b""
        if not data:
            self.orphan_at = time.monotonic()
            log("WARNING", "API server is gone; EngineCore keeps running (orphaned)")
        *lines, self.buf = (self.buf + data).split(b"\n")
        self.waiting += [_Req(m["id"], m["prompt"], m["max"]) for m in map(json.loads, lines)]

    def step(self, now: float) -> list[_Req]:
        """One scheduler step through the workers; return the finished requests."""
        while self.waiting and len(self.running) < self.a.max_num_seqs:
            req = self.waiting.pop(0)
            req.start, self.prompt = now, self.prompt + req.prompt
            self.running.append(req)
        if not (self.running or self.a.busy):
            return []
        try:  # a stopped worker blocks the step, as a hung TP worker blocks real vLLM
            for _, sock in self.workers:
                sock.sendall(b"s")
            ok = all(sock.recv(1) for _, sock in self.workers)
        except OSError:
            ok = False
        if not ok:
            self.crash("Worker proc died unexpectedly, shutting down executor.", "worker died")
        slow, finished, keep = self.a.slow_completion, list[_Req](), list[_Req]()
        for req in self.running:
            frac = 1.0 if slow <= 0 else min(1.0, (now - req.start) / slow)
            target = int(req.max_tokens * frac)
            self.gen, req.done = self.gen + target - req.done, target
            (finished if frac >= 1.0 else keep).append(req)
        self.running, self.ok = keep, self.ok + len(finished)
        self.gen += _BUSY_SEQS if self.a.busy else 0
        return finished

    def send(self, finished: list[_Req]) -> None:
        """Send stats (first, so counters are current) and then the finished requests."""
        run = len(self.running) + (_BUSY_SEQS if self.a.busy else 0)
        msgs: list[dict[str, Any]] = [{"run": run, "wait": len(self.waiting), "ok": self.ok,
                                       "prompt": self.prompt, "gen": self.gen,
                                       "kv": min(1.0, 0.05 * run)}]
        msgs += [{"done": r.id, "tokens": r.done} for r in finished]
        if self.orphan_at is None:
            with contextlib.suppress(OSError):
                self.api.sendall(b"".join(json.dumps(m).encode() + b"\n" for m in msgs))
        self.sent_at = time.monotonic()


def engine_main(a: argparse.Namespace, flags: list[str]) -> int:
    """EngineCore process: workers, startup milestones, then the request loop."""
    global _PREFIX
    _PREFIX, engine = "EngineCore", Engine(a)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the API server handles Ctrl-C
    signal.signal(signal.SIGTERM, signal.SIG_IGN if a.ignore_sigterm else engine.on_term)
    tp = a.tensor_parallel_size
    engine.start(flags, a.workers if a.workers is not None else (tp if tp > 1 else 0))
    engine.run()


def worker_main(a: argparse.Namespace) -> int:
    """A TP worker: answer each engine step; exit when the engine goes away."""
    global _PREFIX
    _PREFIX = "Worker"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if a.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log("INFO", f"Worker_TP{a.rank} started for model {a.model}", "gpu_worker.py:2")
    sock = socket.socket(fileno=a.fd)
    with contextlib.suppress(OSError):
        sock.sendall(b"r")
        while sock.recv(1):
            sock.sendall(b"k")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point for all three roles: API server, engine, worker."""
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    if a.role == "engine":
        return engine_main(a, argv[:-_CHILD_EXTRA])
    return worker_main(a) if a.role == "worker" else api_main(a, argv)


if __name__ == "__main__":
    sys.exit(main())
