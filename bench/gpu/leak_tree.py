#!/usr/bin/env python3
"""A process tree that leaks GPU memory in a grandchild, sampled with vllmwatch's sampler.

Needs an NVIDIA GPU, torch with CUDA and nvidia-ml-py; no vLLM, no network. Three roles:

  leak_tree.py [run] --gpus 0,1 ...   the runner: starts the tree, samples it every second
                                      with vllmwatch.shell.memory.make_sampler, applies the leak
                                      rules, stops the tree when one fires and waits on the
                                      GPU release gate; prints JSON lines on stdout.
  leak_tree.py serve [--port P] ...   the child (an API server): one leaking grandchild per
                                      visible GPU (EngineCore, or TP workers), an optional
                                      /health on P; exits 0 when a grandchild dies, as vLLM
                                      does. Tolerates vLLM's flags, so vllmwatch can run it
                                      as its child: command = ["python3", THIS, "serve"].
  leak_tree.py leak --ordinal I ...   a grandchild: allocates --step-mib with torch on cuda:I
                                      every --every seconds up to --max-mib.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from vllmwatch.config.schema import MemoryConfig
from vllmwatch.core import leak
from vllmwatch.shell import memory
from vllmwatch.shell.memory import make_sampler

THIS = str(Path(__file__).resolve())


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout."""
    print(json.dumps({"event": event, **fields}, default=str), flush=True)


def leak_flags(a: argparse.Namespace) -> list[str]:
    return ["--step-mib", str(a.step_mib), "--every", str(a.every), "--max-mib", str(a.max_mib),
            "--leak-after", str(a.leak_after), "--lifetime", str(a.lifetime)]


# ---- grandchild ----

def leak_main(a: argparse.Namespace) -> int:
    import torch  # type: ignore[import-not-found, unused-ignore]  # only here: keeps the rest light

    dev = torch.device(f"cuda:{a.ordinal}")
    blocks = [torch.ones(1, device=dev)]  # the CUDA context first (~0.5 GiB), like a model
    print(f"(Leaker pid={os.getpid()}) on {torch.cuda.get_device_name(dev)} "
          f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}", file=sys.stderr,
          flush=True)
    start = time.monotonic()
    next_at, held = start + a.leak_after, 0
    while time.monotonic() - start < a.lifetime:  # a bound if everything above us died
        if held + a.step_mib <= a.max_mib and time.monotonic() >= next_at:
            blocks.append(torch.ones(a.step_mib << 20, dtype=torch.uint8, device=dev))
            torch.cuda.synchronize(dev)
            held += a.step_mib
            next_at += a.every
            print(f"(Leaker pid={os.getpid()}) holds {held} MiB", file=sys.stderr, flush=True)
        time.sleep(0.05)
    return 0


# ---- child ----

class _Api(BaseHTTPRequestHandler):
    healthy: Any = None  # set by serve_main: () -> bool

    def _send(self, code: int, body: dict[str, Any] | str) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # http.server's name
        if self.path == "/health":
            self._send(200 if _Api.healthy() else 503, "")
        elif self.path == "/metrics":
            self._send(200, "vllm:num_requests_running 0.0\nvllm:num_requests_waiting 0.0\n")
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "leak-tree", "object": "model"}]})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:  # http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path in ("/v1/completions", "/v1/chat/completions"):
            self._send(200, {"id": "x", "object": "text_completion", "model": "leak-tree",
                             "choices": [{"index": 0, "text": "ok", "finish_reason": "length",
                                          "message": {"role": "assistant", "content": "ok"}}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                       "total_tokens": 2}})
        else:
            self._send(404, {"error": "not found"})

    def log_message(self, format: str, *args: Any) -> None:  # stdlib's signature
        """Quiet."""


def serve_main(a: argparse.Namespace) -> int:
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    workers = a.workers or len(visible) or 1
    # Same process group as us, as vLLM's EngineCore and workers are.
    kids = [subprocess.Popen([sys.executable, THIS, "leak", "--ordinal", str(i), *leak_flags(a)])
            for i in range(workers)]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    _Api.healthy = lambda: all(k.poll() is None for k in kids)
    if a.port:
        server = ThreadingHTTPServer((a.host, a.port), _Api)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"(APIServer pid={os.getpid()}) workers={[k.pid for k in kids]}", file=sys.stderr)
    print("Application startup complete.", file=sys.stderr, flush=True)
    while not stop.wait(0.1) and _Api.healthy():
        pass
    for k in kids:
        with contextlib.suppress(ProcessLookupError):
            k.terminate()
    for k in kids:
        k.wait(timeout=30)
    return 0  # vLLM exits 0 when its engine dies: the supervisor must not trust the code


# ---- runner ----

def header(sampler: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                           "host": socket.gethostname(), **sampler.describe()}
    for dist in ("torch", "nvidia-ml-py"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[dist] = importlib.metadata.version(dist)
    return out


def stop_tree(child: subprocess.Popen[bytes], grace: float) -> str:
    """SIGTERM the group, SIGKILL it after grace, reap; say how it ended."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    try:
        child.wait(timeout=grace)
        how = "sigterm"
    except subprocess.TimeoutExpired:
        how = "sigkill"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)  # whatever of the group is left
    child.wait()
    return how


def run_main(a: argparse.Namespace) -> int:
    gpus = [int(g) for g in a.gpus.split(",")]
    sampler = make_sampler(gpus, lambda level, event, **f: emit(event, level=level, **f))
    emit("header", **header(sampler), gpus_configured=gpus, args=vars(a))
    before = sampler.device_used_mib()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=a.gpus, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    argv = [sys.executable, THIS, "serve", *leak_flags(a)] + (
        ["--port", str(a.port)] if a.port else [])
    child = subprocess.Popen(argv, env=env, stdout=sys.stderr, start_new_session=True)
    emit("child.started", pid=child.pid, before_launch_mib=before)
    try:
        verdict, seen = sample_loop(a, sampler, child, gpus)
    finally:
        stopped_at = time.monotonic()
        how = stop_tree(child, a.grace)
    emit("child.stopped", how=how, seconds=round(time.monotonic() - stopped_at, 3))
    ok = release_loop(a, sampler, seen, before)
    fired_ok = verdict is not None or a.growth_limit_mib <= 0
    emit("summary", rule=None if verdict is None else verdict.rule, released=ok,
         passed=ok and fired_ok)
    return 0 if ok and fired_ok else 1


def sample_loop(a: argparse.Namespace, sampler: Any, child: subprocess.Popen[bytes],
                gpus: list[int]) -> tuple[leak.LeakVerdict | None, set[int]]:
    """Sample every --interval s until a rule fires, the child exits or --duration ends."""
    cfg = MemoryConfig(gpu_growth_limit=a.growth_limit_mib, baseline_delay=a.baseline_delay,
                       sustain=a.sustain, slope_window=600)
    start = time.monotonic()
    state, seen, i = None, set[int](), 0
    while time.monotonic() - start < a.duration:
        t0 = time.monotonic()
        s = sampler.sample(child.pid, with_pss=i % a.pss_every == 0)
        took = time.monotonic() - t0
        seen.update(s.tree_pids)
        if state is None and set(s.gpu_tree_by_gpu_mib) >= set(gpus):
            # READY: every GPU holds a CUDA context of the tree; the baseline counts from here.
            state = leak.new_state(t0)
            emit("ready", t=round(t0 - start, 3))
        verdict = None
        if state is not None:
            state, verdict = leak.observe(state, cfg, t0, s.gpu_rule_mib, s.host_rule_mib)
        base = leak.figures(state) if state is not None else (None,) * 4
        emit("sample", t=round(t0 - start, 3), sample_ms=round(took * 1000, 2), **asdict(s),
             gpu_rule_mib=s.gpu_rule_mib, gpu_baseline_mib=base[0], gpu_slope_mib_per_h=base[2],
             procs=[asdict(p) for p in sampler.gpu_processes() or []])
        if a.port and i == 2:
            emit("health", status=_health(a.port))
        if verdict is not None:
            emit("leak.verdict", **asdict(verdict))
            return verdict, seen
        if child.poll() is not None:
            emit("child.exited", code=child.returncode)
            return None, seen
        i += 1
        time.sleep(max(0.0, start + i * a.interval - time.monotonic()))
    return None, seen


def release_loop(a: argparse.Namespace, sampler: Any, old: set[int],
                 before: dict[int, float]) -> bool:
    start = time.monotonic()
    while True:
        ok, detail = memory.release_check(sampler, old, before, a.tolerance_mib)
        waited = round(time.monotonic() - start, 3)
        emit("release.check", released=ok, detail=detail, seconds=waited,
             device_used_mib=sampler.device_used_mib())
        if ok or waited > a.release_timeout:
            return ok
        time.sleep(0.25)


def _health(port: int) -> int | str:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return int(r.status)
    except OSError as exc:
        return str(exc)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("role", nargs="?", default="run", choices=("run", "serve", "leak"))
    p.add_argument("--gpus", default="0", help="runner: NVML indexes, e.g. 0,1")
    p.add_argument("--workers", type=int, default=0, help="serve: default one per visible GPU")
    p.add_argument("--ordinal", type=int, default=0, help="leak: CUDA device ordinal")
    p.add_argument("--step-mib", type=int, default=512)
    p.add_argument("--every", type=float, default=3.0, help="seconds between steps")
    p.add_argument("--max-mib", type=int, default=4096, help="per grandchild")
    p.add_argument("--leak-after", type=float, default=10.0, help="seconds before the first step")
    p.add_argument("--lifetime", type=float, default=900.0, help="leak: exit after this")
    p.add_argument("--port", type=int, default=0, help="serve /health here (0: no HTTP)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--interval", type=float, default=1.0, help="runner: seconds per sample")
    p.add_argument("--pss-every", type=int, default=10, help="runner: PSS every N samples")
    p.add_argument("--duration", type=float, default=120.0, help="runner: sampling limit")
    p.add_argument("--growth-limit-mib", type=float, default=1536.0, help="0: rule off")
    p.add_argument("--baseline-delay", type=float, default=5.0)
    p.add_argument("--sustain", type=int, default=3)
    p.add_argument("--grace", type=float, default=15.0, help="SIGTERM -> SIGKILL seconds")
    p.add_argument("--release-timeout", type=float, default=60.0)
    p.add_argument("--tolerance-mib", type=float, default=512.0)
    return p.parse_known_args(argv)  # serve ignores vLLM's flags (--model, ...)


def main(argv: list[str]) -> int:
    a, unknown = parse(argv)
    if a.role == "leak":
        return leak_main(a)
    if a.role == "serve":
        return serve_main(a)
    if unknown:
        emit("error", detail=f"unknown arguments: {unknown}")
        return 2
    return run_main(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
