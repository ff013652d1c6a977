"""The fake vLLM's engine side: EngineCore and TP worker processes, their scheduler and stats.

Also the plumbing every role shares: ``(Role pid=N)``-prefixed output and spawning a child
role. ``vllmwatch.testing.fake_vllm`` stays the one entry point: children run it again
with ``--role``.
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
from types import FrameType
from typing import Any, NoReturn

from vllmwatch.testing.fake_caches import start_caches

_OUT = threading.Lock()
_PREFIX = "APIServer"
CHILD_EXTRA = 7  # argv items that spawn appends after the user's flags
_BUSY_SEQS = 4  # synthetic sequences that --busy keeps running


def emit(text: str) -> None:
    """Write one ``(Role pid=N)``-prefixed line to stdout and flush; never raise."""
    with _OUT, contextlib.suppress(OSError, ValueError):
        sys.stdout.write(f"({_PREFIX} pid={os.getpid()}) {text}\n")
        sys.stdout.flush()


def log(level: str, msg: str, where: str = "fake_vllm.py:1") -> None:
    """Emit a vLLM-style line: ``INFO 11-29 17:00:00 [file.py:1] msg``."""
    emit(f"{level} {time.strftime('%m-%d %H:%M:%S')} [{where}] {msg}")


def spawn(entry: list[str], marker: str, role: str, flags: list[str], rank: int = 0
          ) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """Run the fake (``entry``: argv after python) as a child ``role``, linked by a socketpair.

    The child stays in our process group, as vLLM's engine and workers do.
    """
    mine, theirs = socket.socketpair()
    argv = [sys.executable, *entry, *flags, marker,
            "--role", role, "--fd", str(theirs.fileno()), "--rank", str(rank)]
    proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),))
    theirs.close()
    return proc, mine


def leak(a: argparse.Namespace, where: str, faults: FaultClock) -> None:
    """Start a thread that grows RSS by --leak-mib-per-s, touching every page, from the
    moment the faults are armed (FaultClock)."""
    def grow(hoard: list[bytearray], due: float) -> None:
        while faults.age() == -math.inf:
            time.sleep(0.05)
        due = time.monotonic()
        while True:
            hoard.append(bytearray(b"\xa5") * int(a.leak_mib_per_s * 2**20 / 10))
            due += 0.1
            time.sleep(max(0.0, due - time.monotonic()))
    if a.leak_mib_per_s > 0 and a.leak_in == where:
        threading.Thread(target=grow, args=([], time.monotonic()), daemon=True).start()


def write_traceback(error: str, where: str) -> None:
    """Write a Python-looking traceback ending in ``error`` to stderr, as vLLM's crashes do."""
    sys.stderr.write(f'Traceback (most recent call last):\n  File "{where}", line 1, in run\n'
                     f"{error}\n")
    sys.stderr.flush()


def after(seconds: float | None) -> float:
    """A fault delay, or never when the flag is unset (0 means at once)."""
    return math.inf if seconds is None else seconds


class FaultClock:
    """Where the ``--*-after`` fault delays count from: this role's ready, or with
    ``--arm-file PATH`` the moment PATH is touched after this process started.

    Seconds since ready race the supervisor on a loaded machine (the fault can fire before
    it saw READY); a test touches the file once it has, and a restarted fake, started after
    the touch, stays healthy.
    """

    def __init__(self, path: str | None) -> None:
        # The file as it was at our start: a touch changes it. Not its mtime against our
        # start's wall time: a wall-clock step (CI's box had one) left a touch unseen.
        self.path, self.born, self.at = path, _stamp(path), math.inf

    def ready(self) -> None:
        """This role is up: without an arm file the fault delays count from now."""
        if self.path is None:
            self.at = time.monotonic()

    def age(self) -> float:
        """Seconds since the faults were armed; -inf while they are not."""
        if self.at == math.inf and self.path is not None and _stamp(self.path) != self.born:
            self.at = time.monotonic()
        return time.monotonic() - self.at


def _stamp(path: str | None) -> tuple[int, int, int] | None:
    """What a touch of the file changes (None while there is none)."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns


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
        self.faults = FaultClock(a.arm_file)

    def on_term(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM: stop the workers, then exit 0."""
        for proc, _ in self.workers:
            proc.terminate()
        for proc, _ in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.3)
            proc.kill()
        os._exit(0)

    def start(self, entry: list[str], flags: list[str], workers: int) -> None:
        """Spawn workers and print the startup milestones over --startup-seconds."""
        a, s = self.a, self.a.startup_seconds
        self.workers = [spawn(entry, f"VLLM::Worker_TP{i}", "worker", flags, i)
                        for i in range(workers)]
        aot, plan = start_caches(os.environ)
        lines = [("gpu_model_runner.py:1", f"Starting to load model {a.model}..."),
                 ("default_loader.py:1", f"Loading weights took {s * 0.2:.2f} seconds"),
                 ("gpu_model_runner.py:2", f"Model loading took 0.1 GiB and {s * 0.3:.2f} sec"),
                 *aot,
                 ("monitor.py:1", f"torch.compile took {s * 0.2:.2f} s in total"),
                 *plan,
                 ("gpu_worker.py:1", "Available KV cache memory: 1.0 GiB"),
                 ("gpu_model_runner.py:3", "Capturing CUDA graphs (decode, FULL): 100%"),
                 ("gpu_model_runner.py:4", "Graph capturing finished in 1 secs, took 0.05 GiB"),
                 ("core.py:1", f"init engine (profile, create kv cache, warmup model) took "
                  f"{s:.2f} seconds")]
        t0 = time.monotonic()
        crash_at = t0 + after(a.crash_during_start)
        for i, (where, msg) in enumerate(lines):
            log("INFO", msg, where)
            time.sleep(max(0.0, min(t0 + s * (i + 1) / len(lines), crash_at) - time.monotonic()))
            if time.monotonic() >= crash_at:
                break
        while a.hold_start_until and not os.path.exists(a.hold_start_until):
            time.sleep(0.05)  # a start that lasts exactly until the test ends it
        if crash_at < math.inf:
            time.sleep(max(0.0, crash_at - time.monotonic()))
            self.crash("EngineCore failed to start.", "injected crash (--crash-during-start)")
        if not all(sock.recv(1) for _, sock in self.workers):  # each says "ready" once
            self.crash("EngineCore failed to start.", "a worker died during startup")

    def crash(self, msg: str, why: str) -> NoReturn:
        """Log an engine error with a traceback-like message and exit 1."""
        log("ERROR", msg, "core.py:2")
        write_traceback(f"RuntimeError: {why}", "vllm/v1/engine/core.py")
        os._exit(1)

    def run(self) -> NoReturn:
        """Serve requests until a fault, SIGTERM, or the end of an orphanhood."""
        a, stalled = self.a, False
        self.faults.ready()
        self.send([])  # the first message tells the API server we are ready
        leak(a, "engine", self.faults)
        while True:
            age = self.faults.age()
            if age >= after(a.engine_crash_after):
                self.crash("EngineCore encountered a fatal error.", "injected crash "
                           "(--engine-crash-after)")
            if age >= after(a.hang_after):
                log("WARNING", "Injected fault: engine hang (--hang-after)")
                while True:
                    time.sleep(3600)
            if age >= after(a.deadlock_after):
                log("WARNING", "Injected fault: engine deadlock (--deadlock-after)")
                engine_deadlock()
            if time.monotonic() - after(self.orphan_at) >= a.orphan_timeout:
                os._exit(0)
            if not stalled and age >= after(a.stall_after):
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
        if any(req.prompt < 0 for req in self.running):
            self.crash("EngineCore encountered a fatal error.", "injected crash "
                       "(--crash-on-prompt)")
        try:  # a stopped worker blocks the step, as a hung TP worker blocks real vLLM
            for _, sock in self.workers:
                sock.sendall(b"s")
            ok = all(sock.recv(1) for _, sock in self.workers)
        except OSError:
            ok = False
        if not ok:
            self.crash("Worker proc died unexpectedly, shutting down executor.", "worker died")
        slow, finished, keep = self.a.slow_completion, list[_Req](), list[_Req]()
        if len(self.running) > 1:  # a loaded engine answers everyone slower
            slow = max(slow, self.a.slow_when_busy)
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


def engine_deadlock() -> NoReturn:
    """A real deadlock (not a sleep): this thread and a helper take two locks in opposite
    order, each holding the one the other waits for. Incident tests look for this frame."""
    first, second = threading.Lock(), threading.Lock()
    both_hold = threading.Barrier(2)

    def take(a: threading.Lock, b: threading.Lock) -> None:
        with a:
            both_hold.wait()
            b.acquire()  # never returns

    threading.Thread(target=take, args=(second, first), name="deadlock-partner",
                     daemon=True).start()
    take(first, second)
    raise AssertionError("unreachable: the deadlock never ends")


def engine_main(a: argparse.Namespace, flags: list[str], entry: list[str]) -> int:
    """EngineCore process: workers, startup milestones, then the request loop."""
    global _PREFIX
    _PREFIX, engine = "EngineCore", Engine(a)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the API server handles Ctrl-C
    signal.signal(signal.SIGTERM, signal.SIG_IGN if a.ignore_sigterm else engine.on_term)
    tp = a.tensor_parallel_size
    engine.start(entry, flags, a.workers if a.workers is not None else (tp if tp > 1 else 0))
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
