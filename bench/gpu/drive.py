#!/usr/bin/env python3
"""Device side of vllm_h200.sh: a real vLLM on one H200, plain and under vllmwatch, measured.

    python3 vllm_h200_drive.py PHASE [PHASE ...] [--budget SECONDS]
    python3 vllm_h200_drive.py auto --budget 540   # the phases not yet done, in order, while
                                                   # each one's time estimate still fits

Phases:
  probe0   before the install: GPU, driver, Python, tools, which packages the image has
  probe    after it: vLLM imports, FA2/FA3 availability, the FA version vLLM picks on this GPU
  serve    plain `vllm serve` (tiny model): /health time, attention backend, a completion, the
           vllm: metric names, NVML per process, SIGTERM
  watch    `vllmwatch run` (tiny model, compile cache kept from `serve`): READY and its phases,
           `vllmwatch status --json`, NVML per process against the tree, kill -9 of EngineCore
           (detection, reason, GPU release gate, READY again), SIGTERM (exit code, leftovers)
  prewarm  `vllmwatch prewarm` (its kernel step), a direct FA3 warm-up for comparison, then a
           cold start (fresh caches) and a warm restart (SIGUSR1, caches kept) under vllmwatch
  biggen   write the Qwen3-8B-shaped random model (vllm_h200_model.py)
  big      that model under vllmwatch: cold start, warm restart (SIGUSR1), kill -9 EngineCore

`auto` records each phase in $VLLM_H200_WORK/state.json, failed ones too (status "error: ..."),
and never repeats one: name a phase to run it again.

Every measurement is one JSON line: printed as '## {...}' and appended to $OUT/summary.jsonl.
Raw logs go to $VLLM_H200_WORK/logs (vllm_h200.sh packs them into $OUT/logs.tar.gz). Times are
seconds (monotonic clock) from the event named in the field. Every process started here is
ended here (by pid or process group) before a phase returns, whatever happened.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

OUT = Path(os.environ.get("OUT") or "/tmp/vllm_h200_out")
WORK = Path(os.environ.get("VLLM_H200_WORK") or "/tmp/vllm_h200")
LOGS = WORK / "logs"
STATE = WORK / "state.json"
HERE = Path(__file__).resolve().parent
VW_SRC = Path(os.environ.get("VLLM_H200_VW_SRC") or Path.cwd())
BIN = Path(sys.executable).parent
VLLM = os.environ.get("VLLM_H200_VLLM") or shutil.which("vllm") or str(BIN / "vllm")
VLLMWATCH = os.environ.get("VLLM_H200_VLLMWATCH") or shutil.which("vllmwatch") or str(
    BIN / "vllmwatch")
TINY = WORK / "models" / "tiny"
BIG = WORK / "models" / "qwen3-8b-shape"
# The tiny model needs 512 bytes of KV cache a token: left to gpu-memory-utilization it would get
# ~120 GiB (hundreds of millions of tokens, millions of block objects). 2 GiB is 4M tokens.
TINY_KV = 2 * 2**30
ORDER = ["probe", "serve", "watch", "prewarm", "biggen", "big"]
# Upper estimates (s) used by `auto` to decide whether a phase still fits in this call.
# Seen on the H200 (2026-11-30): probe 38, serve 73, watch 152, prewarm 234; biggen and big
# have not run there yet (guesses).
EST = {"probe0": 30, "probe": 60, "serve": 150, "watch": 220, "prewarm": 300, "biggen": 150,
       "big": 500}
T0 = time.monotonic()
DEADLINE = [T0 + 540.0]
MILESTONES = ("Starting to load model", "Loading weights took", "Model loading took",
              "Dynamo bytecode transform time", "Compiling a graph for", "Directly load",
              "torch.compile took", "Available KV cache memory", "GPU KV cache size",
              "Capturing CUDA graphs", "Graph capturing finished", "init engine",
              "Starting vLLM server on", "Application startup complete")
INFO_RE = re.compile(r"attention backend out of potential backends|Using FlashAttention version"
                     r"|Using .* backend|Loading weights took|Model loading took|torch\.compile "
                     r"took|Available KV cache memory|GPU KV cache size|Graph capturing finished"
                     r"|init engine|Directly load|Maximum concurrency|compile range|cudagraph"
                     r"|CUDA graph", re.I)


# ------------------------------------------------------------------------------------ output
def emit(phase: str, what: str, **fields: Any) -> dict[str, Any]:
    rec = {"t": round(time.monotonic() - T0, 2), "phase": phase, "what": what, **fields}
    line = json.dumps(rec, default=str)
    print("## " + line, flush=True)
    for path in (OUT / "summary.jsonl", WORK / "summary-all.jsonl"):
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    return rec


def left() -> float:
    return DEADLINE[0] - time.monotonic()


def sh(cmd: str, timeout: float = 60) -> str:
    try:
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
        return (r.stdout + r.stderr).strip()
    except subprocess.TimeoutExpired:
        return f"timeout after {timeout}s"


# -------------------------------------------------------------------------------------- HTTP
def http(method: str, url: str, body: Any = None, timeout: float = 5.0) -> tuple[int | None, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, method=method, data=data,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except Exception as e:  # refused, reset, timeout
        return None, f"{type(e).__name__}: {e}"


def completion(port: int, model: str, prompt: str = "Hello", max_tokens: int = 8,
               timeout: float = 60) -> dict[str, Any]:
    t = time.monotonic()
    code, body = http("POST", f"http://127.0.0.1:{port}/v1/completions",
                      {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0}, timeout)
    out: dict[str, Any] = {"status": code, "seconds": round(time.monotonic() - t, 3)}
    try:
        j = json.loads(body)
        out.update(text=j["choices"][0]["text"], finish=j["choices"][0]["finish_reason"],
                   usage=j.get("usage"), fingerprint=j.get("system_fingerprint"))
    except Exception:
        out["body"] = body[:300]
    return out


def metric_names(port: int) -> dict[str, Any]:
    code, body = http("GET", f"http://127.0.0.1:{port}/metrics", timeout=10)
    names = sorted({re.split(r"[{ ]", ln, maxsplit=1)[0] for ln in body.splitlines()
                    if ln.startswith("vllm:")})
    base = sorted({re.sub(r"_(bucket|sum|count|created|total)$", "", n) for n in names})
    return {"status": code, "lines": len(body.splitlines()), "vllm_series": len(names),
            "names": base}


# -------------------------------------------------------------------------------------- NVML
class Nvml:
    """Every GPU NVML sees: used memory (summed and per GPU) and the compute processes."""

    def __init__(self) -> None:
        self.ok = False
        self.hs: list[Any] = []
        try:
            import pynvml as N
            N.nvmlInit()
            self.N = N
            self.hs = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
            self.ok = True
        except Exception as exc:
            self.err = f"{type(exc).__name__}: {exc}"

    def used_by_gpu(self) -> list[int]:
        if not self.ok:
            return []
        return [int(self.N.nvmlDeviceGetMemoryInfo(h).used >> 20) for h in self.hs]

    def used_mib(self) -> int | None:
        return sum(self.used_by_gpu()) if self.ok else None

    def procs(self, gpu: int | None = None) -> list[tuple[int, int]]:
        """(pid, MiB) per process and GPU (a TP process shows once per GPU it holds)."""
        if not self.ok:
            return []
        hs = self.hs if gpu is None else [self.hs[gpu]]
        return [(p.pid, int((p.usedGpuMemory or 0) >> 20)) for h in hs
                for p in self.N.nvmlDeviceGetComputeRunningProcesses(h)]

    def snapshot(self) -> dict[str, Any]:
        if not self.ok:
            return {"nvml": self.err}
        return {"used_mib": self.used_mib(), "used_by_gpu_mib": self.used_by_gpu(),
                "procs": [{"gpu": i, "pid": pid, "mib": mib, "title": title(pid)}
                          for i in range(len(self.hs)) for pid, mib in self.procs(i)]}


NV = Nvml()


# -------------------------------------------------------------------------------- processes
def title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            "utf-8", "replace").strip()[:120]
    except OSError:
        return "?"


def descendants(pid: int) -> list[int]:
    import psutil
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def find_titled(prefix: str, root: int | None = None) -> int | None:
    pids = descendants(root) if root else [int(p) for p in os.listdir("/proc") if p.isdigit()]
    for pid in pids:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            comm = ""
        try:  # vLLM's setproctitle makes the whole cmdline "VLLM::EngineCore"; the fake
            full = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, UnicodeDecodeError):  # vLLM (tests) carries it as an argument
            full = ""
        if full.startswith(prefix) or f" {prefix} " in f" {full} " or (
                comm and prefix.startswith(comm) and len(comm) >= 12):
            return pid
    return None


# Only what this driver started is ever killed: the process groups of its own children
# (plain `vllm serve`, `vllmwatch run`) and the sessions vllmwatch creates for each vLLM it
# launches (child.started pid = session id; vLLM's EngineCore and workers keep that session
# even when orphaned). Other processes are listed in reports, never signalled.
OWN_PGIDS: set[int] = set()
OWN_SIDS: set[int] = set()


def ids(pid: int) -> tuple[int, int, int] | None:
    """(process group, session, start time in clock ticks after boot) from /proc/PID/stat."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(rest[2]), int(rest[3]), int(rest[19])
    except (OSError, IndexError, ValueError):
        return None


MY_START = (ids(os.getpid()) or (0, 0, 0))[2]


def ours() -> list[dict[str, Any]]:
    """Processes in our groups or sessions, started after this driver (never an older one)."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        g = ids(int(p))
        if g and g[2] >= MY_START and (g[0] in OWN_PGIDS or g[1] in OWN_SIDS):
            out.append({"pid": int(p), "title": title(int(p)), "state": state(int(p))})
    return out


def state(pid: int) -> str:
    """The state letter of /proc/PID/stat (Z = zombie: exited, not yet reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def vllm_like() -> list[dict[str, Any]]:
    """Every process on the machine that looks like vLLM or vllmwatch (for reports only)."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        t = title(int(p))
        if t.startswith("VLLM::") or ("vllm" in t and " serve " in f" {t} ") or \
                t.split(" ")[0].endswith("/vllmwatch") or " vllmwatch run " in f" {t} ":
            out.append({"pid": int(p), "title": t})
    return out


def sweep(phase: str) -> list[dict[str, Any]]:
    """SIGKILL, by pid, what is left of the process groups and sessions we started."""
    found = ours()
    for p in found:
        with contextlib.suppress(OSError):
            os.kill(p["pid"], signal.SIGKILL)
    if found:
        emit(phase, "sweep_killed", processes=found)
        time.sleep(1)
    return found


def wait_idle_gpu(limit: float = 60) -> dict[str, Any]:
    """Wait until NVML lists no process (the previous phase's memory is back)."""
    t = time.monotonic()
    while time.monotonic() - t < limit and NV.ok and NV.procs():
        time.sleep(0.5)
    return {"waited_s": round(time.monotonic() - t, 2), **NV.snapshot()}


# ----------------------------------------------------------------------------------- helpers
def cache_env(root: Path) -> dict[str, str]:
    """The cache variables vllmwatch sets for prewarm.cache_dir = root (prewarm.CACHE_VARS)."""
    return {"VLLM_CACHE_ROOT": str(root / "vllm"), "TRITON_CACHE_DIR": str(root / "triton"),
            "FLASHINFER_WORKSPACE_BASE": str(root / "flashinfer"),
            "HF_HOME": str(root / "huggingface")}


def du_mib(path: Path) -> float:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return round(total / 2**20, 1)


def ensure_tiny() -> None:
    if (TINY / ".vllmwatch-tiny-model").is_file():
        return
    t = time.monotonic()
    out = sh(f"{sys.executable} {VW_SRC}/scripts/make_tiny_model.py {TINY}", 120)
    emit("model", "tiny", seconds=round(time.monotonic() - t, 1), out=out.splitlines()[-1:])


class LineLog:
    """Read a child's output in a thread: timestamp every line into a file, keep milestones."""

    def __init__(self, stream: Any, path: Path, t0: float, json_events: bool = False) -> None:
        self.t0, self.json_events = t0, json_events
        self.fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed with the process
        self.events: list[tuple[float, dict[str, Any]]] = []  # vllmwatch events
        self.lines: list[tuple[float, str]] = []  # interesting vLLM lines
        self.first: dict[str, float] = {}
        self.lock = threading.Lock()
        self.th = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self.th.start()

    def _run(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            t = time.monotonic() - self.t0
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.fh.write(f"{t:9.2f} {line}\n")
            self.fh.flush()
            text = line
            if self.json_events:
                try:
                    ev = json.loads(line)
                except ValueError:
                    ev = None
                if isinstance(ev, dict):
                    if ev.get("event") == "child.started" and isinstance(ev.get("pid"), int):
                        OWN_SIDS.add(ev["pid"])  # vllmwatch starts each vLLM in a new session
                    with self.lock:
                        self.events.append((t, ev))
                    text = ev.get("text", "") if ev.get("event") == "child.line" else ""
            if text:
                self._note(t, text)

    def _note(self, t: float, text: str) -> None:
        with self.lock:
            for m in MILESTONES:
                if m in text and m not in self.first:
                    self.first[m] = round(t, 2)
            if INFO_RE.search(text):
                self.lines.append((round(t, 2), text[-260:]))

    def wait(self, pred: Any, since: int = 0, timeout: float = 60) -> tuple[int, float, dict]:
        """First event from index `since` on that satisfies pred: (index, t, event)."""
        end = time.monotonic() + max(0.0, min(timeout, left() - 10))
        while True:
            with self.lock:
                evs = self.events[since:]
            for k, (t, ev) in enumerate(evs):
                if pred(ev):
                    return since + k, t, ev
            if time.monotonic() >= end:
                return -1, -1.0, {}
            time.sleep(0.1)

    def named(self, name: str, since: int = 0, until: int | None = None) -> list[dict]:
        with self.lock:
            evs = self.events[since:until]
        return [{"t": round(t, 2), **{k: v for k, v in ev.items() if k != "ts"}}
                for t, ev in evs if ev.get("event") == name]

    def count(self) -> int:
        with self.lock:
            return len(self.events)


# ------------------------------------------------------------------------------------ phases
def phase_probe0() -> None:
    emit("probe0", "host", uname=sh("uname -a"), python=sys.version.split()[0],
         executable=sys.executable, nproc=os.cpu_count(),
         mem=sh("grep -E 'MemTotal|MemAvailable' /proc/meminfo"),
         disk=sh("df -h / /tmp | tail -n +2"), xz=sh("command -v xz zstd gcc nvcc"),
         purelib=sh(f"{sys.executable} -c 'import sysconfig;"
                    f"print(sysconfig.get_paths()[\"purelib\"])'"))
    emit("probe0", "gpu", nvidia_smi=sh("nvidia-smi --query-gpu=name,driver_version,"
                                        "memory.total,memory.used --format=csv,noheader"),
         cuda=sh("nvidia-smi | grep -o 'CUDA Version: [0-9.]*'"), nvml=NV.snapshot())
    names = ("torch transformers tokenizers numpy numba protobuf setuptools triton "
             "huggingface-hub safetensors pillow opencv-python-headless uvloop aiohttp "
             "prometheus-client nvidia-ml-py psutil pydantic fastapi starlette openai "
             "jsonschema pyzmq msgspec xgrammar")
    emit("probe0", "packages", pip=sh(f"{sys.executable} -m pip list 2>/dev/null | grep -iwE "
                                      f"'{'|'.join(names.split())}'"))


def phase_probe() -> None:
    code = r'''
import json, time, sys
t = time.monotonic(); out = {}
import torch, vllm
out["import_vllm_s"] = round(time.monotonic() - t, 2)
out["vllm"] = vllm.__version__; out["torch"] = torch.__version__
out["gpu"] = torch.cuda.get_device_name(0); out["cc"] = torch.cuda.get_device_capability(0)
from vllm.platforms import current_platform
out["platform"] = type(current_platform).__name__
import vllm._C_stable_libtorch
from vllm.vllm_flash_attn import flash_attn_interface as fi
out["fa2"] = [fi.FA2_AVAILABLE, fi.FA2_UNAVAILABLE_REASON]
out["fa3"] = [fi.FA3_AVAILABLE, fi.FA3_UNAVAILABLE_REASON]
out["fa4"] = [fi.FA4_AVAILABLE, fi.FA4_UNAVAILABLE_REASON]
from vllm.v1.attention.backends.fa_utils import get_flash_attn_version
out["fa_version_hd64"] = get_flash_attn_version(head_size=64)
out["fa_version_hd128"] = get_flash_attn_version(head_size=128)
missing = {}
for m in ["vllm.entrypoints.openai.api_server", "vllm.v1.engine.core",
          "vllm.v1.worker.gpu_model_runner", "vllm.v1.attention.backends.flash_attn",
          "vllm.model_executor.models.qwen3", "vllm.v1.sample.sampler",
          "vllm.compilation.backends", "vllm.v1.structured_output.backend_xgrammar"]:
    try:
        __import__(m)
    except Exception as e:
        missing[m] = "%s: %s" % (type(e).__name__, e)
out["import_errors"] = missing
try:
    from vllmwatch.prewarm import backend as B
    for hd in (64, 128):
        c = B.choose(tuple(out["cc"]), hd, "bfloat16", B.parse_version(vllm.__version__), {}, {})
        out["vllmwatch_choice_hd%d" % hd] = [c.backend, c.fa_version, c.reason]
except Exception as e:
    out["vllmwatch_choice"] = "%s: %s" % (type(e).__name__, e)
for name in ["flashinfer", "deep_gemm", "cutlass", "tilelang"]:
    try:
        __import__(name); out["has_" + name] = True
    except Exception as e:
        out["has_" + name] = "%s" % type(e).__name__
print("PROBE " + json.dumps(out, default=str))
'''
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    (LOGS / "probe.log").write_text(r.stdout + r.stderr)
    res = next((json.loads(ln[6:]) for ln in r.stdout.splitlines() if ln.startswith("PROBE ")),
               {"rc": r.returncode, "stderr_tail": r.stderr[-2000:]})
    emit("probe", "vllm", seconds=round(time.monotonic() - t, 1), **res)
    emit("probe", "versions", vllm_cli=sh(f"{VLLM} --version", 120).splitlines()[-1:],
         vllmwatch=sh(f"{VLLMWATCH} --version"))


def phase_serve() -> None:
    """Plain `vllm serve`, the tiny model, compile cache in cache1 (shared with `watch`)."""
    ensure_tiny()
    port = 8100
    env = {**os.environ, **cache_env(WORK / "cache1")}
    cmd = [VLLM, "serve", str(TINY), "--served-model-name", "tiny", "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "2048", "--kv-cache-memory-bytes",
           str(TINY_KV), "--dtype", "bfloat16"]
    failed: list[str] = []
    emit("serve", "start", command=" ".join(cmd), gpu=wait_idle_gpu())
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, process_group=0)
    OWN_PGIDS.add(p.pid)
    log = LineLog(p.stdout, LOGS / "serve-vllm.log", t0)
    try:
        t_health = None
        while time.monotonic() - t0 < min(240, left() - 40) and p.poll() is None:
            if http("GET", f"http://127.0.0.1:{port}/health", timeout=2)[0] == 200:
                t_health = round(time.monotonic() - t0, 2)
                break
            time.sleep(0.25)
        emit("serve", "health_200", seconds_from_spawn=t_health, exit_code=p.poll(),
             milestones_s=log.first, lines=log.lines[:40])
        if t_health is None:
            failed.append("vLLM never answered /health 200")
            return
        emit("serve", "completion", **completion(port, "tiny"))
        emit("serve", "chat", status=http("POST", f"http://127.0.0.1:{port}/v1/chat/completions",
             {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
              "max_tokens": 4}, 60)[0])
        emit("serve", "metrics", **metric_names(port))
        engine = find_titled("VLLM::EngineCore", p.pid)
        emit("serve", "tree", api_pid=p.pid, engine_pid=engine,
             tree=[{"pid": d, "title": title(d)} for d in descendants(p.pid)],
             nvml=NV.snapshot())
    finally:
        ts = time.monotonic()
        with contextlib.suppress(OSError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            code = p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            code = p.wait(10)
        stopped = round(time.monotonic() - ts, 2)
        time.sleep(1)
        emit("serve", "sigterm", exit_code=code, seconds=stopped, left_ours=ours(),
             vllm_like_anywhere=vllm_like(),
             gpu_after=wait_idle_gpu(30), cache1_mib=du_mib(WORK / "cache1"))
        sweep("serve")
    if failed:
        raise RuntimeError(failed[0])


def watch_config(name: str, model: Path, served: str, port: int, status_port: int,
                 cache: Path, args: dict[str, Any], gpus: tuple[int, ...] = (0,),
                 env: dict[str, str] | None = None, kernels: bool = False,
                 warmup_request: bool = True, memory: str = "", probe_interval: str = "1s",
                 probe_threshold: int = 3) -> Path:
    """A vllmwatch config for this run; [prewarm] kernels/warmup_request as asked."""
    vargs = "\n".join(f"{k} = {json.dumps(v)}" for k, v in args.items())
    venv = "\n".join(f"{k} = {json.dumps(v)}" for k, v in (env or {}).items())
    gpu_list = ", ".join(str(g) for g in gpus)
    text = f'''# {name}: written by bench/gpu/drive.py
[vllm]
command = ["{VLLM}", "serve"]
model = "{model}"
served_model_name = "{served}"
port = {port}
gpus = [{gpu_list}]
[vllm.env]
HF_HUB_OFFLINE = "1"
VLLM_NO_USAGE_STATS = "1"
VLLM_USE_FLASHINFER_SAMPLER = "0"
NCCL_NVLS_ENABLE = "0"
TORCH_SYMM_MEM_DISABLE_MULTICAST = "1"
NVSHMEM_DISABLE_NVLS = "1"
{venv}
[vllm.args]
{vargs}
[startup]
timeout = "15m"
[probe]
interval = "{probe_interval}"
timeout = "5s"
failure_threshold = {probe_threshold}
metrics_interval = "5s"
canary_interval = "20s"
canary_timeout = "30s"
[memory]
sample_interval = "1s"
pss_interval = "10s"
baseline_delay = "5s"
{memory}
[restart]
drain_timeout = "5s"
stop_timeout = "20s"
backoff_initial = "1s"
gpu_release_timeout = "90s"
[prewarm]
cache_dir = "{cache}"
kernels = {str(kernels).lower()}
warmup_request = {str(warmup_request).lower()}
[status]
listen = "127.0.0.1:{status_port}"
[log]
format = "json"
'''
    path = WORK / f"{name}.toml"
    path.write_text(text)
    return path


class Daemon:
    """`vllmwatch run` as our child (own process group), its JSON events parsed as they come."""

    def __init__(self, phase: str, conf: Path, logname: str) -> None:
        self.phase, self.conf = phase, conf
        self.t0 = time.monotonic()
        self.p = subprocess.Popen([VLLMWATCH, "run", "--config", str(conf), "--log-format",
                                   "json"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, process_group=0)
        OWN_PGIDS.add(self.p.pid)
        self.log = LineLog(self.p.stdout, LOGS / logname, self.t0, json_events=True)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def ready(self, since: int = 0, timeout: float = 600) -> tuple[int, float, dict]:
        return self.log.wait(lambda e: e.get("event") in ("child.ready", "daemon.exit")
                             or e.get("event", "").startswith("crashloop"), since, timeout)

    def status(self) -> dict[str, Any]:
        r = subprocess.run([VLLMWATCH, "status", "--json", "--config", str(self.conf)],
                           capture_output=True, text=True, timeout=30)
        try:
            return json.loads(r.stdout)
        except ValueError:
            return {"rc": r.returncode, "out": (r.stdout + r.stderr)[-500:]}

    def start_report(self, what: str, since: int, idx: int, t: float, ev: dict) -> None:
        """One line per start: READY time, vllmwatch's start phases, vLLM's own milestones."""
        emit(self.phase, what, ready_at_s=round(t, 2), ready_event=ev,
             startup_phases=[{k: e.get(k) for k in ("t", "phase", "at_s")}
                             for e in self.log.named("startup.phase", since, idx + 1)],
             prewarm=[{k: e.get(k) for k in ("t", "step", "status", "seconds", "detail")}
                      for e in self.log.named("prewarm.step", since, idx + 1)],
             child_started=self.log.named("child.started", since, idx + 1)[-1:],
             vllm_lines=[ln for ln in self.log.lines if ln[0] >= self._t_of(since)][:25])

    def _t_of(self, idx: int) -> float:
        with self.log.lock:
            return self.log.events[idx][0] if 0 <= idx < len(self.log.events) else 0.0

    def kill_engine(self, port: int, model: str) -> None:
        """SIGKILL the EngineCore: time to detect, reason, release gate, READY again."""
        child = next((x for x in descendants(self.p.pid) if " serve " in title(x)), None)
        engine = find_titled("VLLM::EngineCore", self.p.pid)
        before = NV.snapshot()
        if engine is None:
            emit(self.phase, "kill_engine", error="no VLLM::EngineCore under vllmwatch",
                 tree=[title(d) for d in descendants(self.p.pid)])
            return
        mark = self.log.count()
        trace: list[tuple[float, int | None, int]] = []
        health: list[tuple[float, int | None]] = []
        stop = threading.Event()

        def sample() -> None:  # NVML and /health, every 0.2 s, on change only
            last_nv: tuple[int | None, int] | None = None
            last_h: int | str | None = "x"
            while not stop.is_set():
                t = round(time.monotonic() - tk, 2)
                used = NV.used_mib()
                pids = [pid for pid, _ in NV.procs()]
                key = (used // 1024 if used else used, len(pids))
                if key != last_nv:
                    trace.append((t, used, len(pids)))
                    last_nv = key
                h = http("GET", f"http://127.0.0.1:{port}/health", timeout=1)[0]
                if h != last_h:
                    health.append((t, h))
                    last_h = h
                time.sleep(0.2)

        tk = time.monotonic()
        os.kill(engine, signal.SIGKILL)
        th = threading.Thread(target=sample, daemon=True)
        th.start()
        idx, t_ready, ev = self.ready(mark, timeout=420)
        stop.set()
        th.join(3)
        tk_d = tk - self.t0
        rel = lambda evs: [{**e, "t_after_kill": round(e["t"] - tk_d, 2)} for e in evs]  # noqa
        emit(self.phase, "kill_engine", engine_pid=engine, api_pid=child,
             gpu_before=before, ready_again_after_kill_s=round(t_ready - tk_d, 2)
             if idx >= 0 else None, ready_event=ev,
             probe_failed=rel(self.log.named("probe.failed", mark))[:3],
             child_exited=rel(self.log.named("child.exited", mark))[:1],
             restart_begin=rel(self.log.named("restart.begin", mark))[:1],
             gpu_release=rel(self.log.named("gpu.released", mark)
                             + self.log.named("gpu.release_timeout", mark))[:2],
             leftovers=rel(self.log.named("leftovers.killed", mark)
                           + self.log.named("leftovers.remaining", mark))[:3],
             child_started=rel(self.log.named("child.started", mark))[:1],
             startup_phases=[{k: e.get(k) for k in ("t", "phase", "at_s")}
                             for e in self.log.named("startup.phase", mark)],
             nvml_trace_after_kill=trace[:40], health_after_kill=health[:20],
             old_engine_alive=Path(f"/proc/{engine}").exists())
        if idx >= 0:
            emit(self.phase, "completion_after_recovery", **completion(port, model))

    def stop(self, sweep_after: bool = True) -> None:
        """SIGTERM vllmwatch: exit code, time, leftovers, GPU memory; then sweep what is ours
        (sweep_after=False when another daemon of ours still runs)."""
        if self.p.poll() is None:
            ts = time.monotonic()
            self.p.send_signal(signal.SIGTERM)
            try:
                code = self.p.wait(max(30.0, min(90.0, left())))
            except subprocess.TimeoutExpired:
                self.p.kill()
                code = self.p.wait(10)
            took = round(time.monotonic() - ts, 2)
        else:
            code, took = self.p.returncode, None
        time.sleep(1)
        emit(self.phase, "sigterm_vllmwatch", exit_code=code, seconds=took, leftovers=ours(),
             vllm_like_anywhere=vllm_like(),
             gpu_after=NV.snapshot(), nvidia_smi=sh("nvidia-smi --query-gpu=memory.used "
                                                   "--format=csv,noheader; nvidia-smi "
                                                   "--query-compute-apps=pid,used_memory "
                                                   "--format=csv,noheader"),
             daemon_exit=self.log.named("daemon.exit")[-1:],
             stopping=[{k: e.get(k) for k in ("t", "event", "reason", "code", "signal")}
                       for e in self.log.named("child.stopping") + self.log.named("child.kill")
                       + self.log.named("child.exited")][-4:])
        if sweep_after:
            sweep(self.phase)


def memory_view(d: Daemon, phase: str) -> None:
    """vllmwatch status --json next to NVML's own per-process view of the tree."""
    st = d.status()
    tree = [d.p.pid, *descendants(d.p.pid)]
    nv = NV.snapshot()
    ours = sum(p["mib"] for p in nv.get("procs", []) if p["pid"] in tree)
    emit(phase, "status_json", status=st)
    emit(phase, "memory_vs_nvml", vllmwatch_source=st.get("memory", {}).get("source"),
         vllmwatch_gpu_tree_mib=st.get("memory", {}).get("gpu_tree_mib"),
         nvml_tree_mib=ours, nvml=nv,
         tree=[{"pid": x, "title": title(x)} for x in tree])


def phase_watch() -> None:
    ensure_tiny()
    conf = watch_config("watch", TINY, "tiny", 8101, 9111, WORK / "cache1",
                        {"max-model-len": 2048, "kv-cache-memory-bytes": TINY_KV,
                         "dtype": "bfloat16"})
    emit("watch", "check", out=sh(f"{VLLMWATCH} check --config {conf}", 180).splitlines()[-40:])
    emit("watch", "print_command", out=sh(f"{VLLMWATCH} print-command --config {conf}", 120))
    emit("watch", "start", gpu=wait_idle_gpu(), cache1_mib=du_mib(WORK / "cache1"))
    d = Daemon("watch", conf, "watch-vllmwatch.log")
    try:
        idx, t, ev = d.ready(0, timeout=420)
        d.start_report("ready", 0, idx, t, ev)
        if idx < 0 or ev.get("event") != "child.ready":
            raise RuntimeError(f"not READY: {ev.get('event')}")
        emit("watch", "completion", **completion(8101, "tiny"))
        time.sleep(7)  # memory samples and the baseline (baseline_delay 5 s)
        memory_view(d, "watch")
        d.kill_engine(8101, "tiny")
        time.sleep(3)
        st = d.status()
        emit("watch", "status_after_recovery", restarts_by_reason=st.get("restarts_by_reason"),
             last_reason=st.get("last_reason"), last_reason_detail=st.get("last_reason_detail"),
             state=st.get("state"), memory_source=st.get("memory", {}).get("source"),
             gpu_tree_mib=st.get("memory", {}).get("gpu_tree_mib"))
    finally:
        d.stop()


FA_SCRIPT = r'''
import json, sys, time
t0 = time.monotonic()
import torch
from vllm.vllm_flash_attn.flash_attn_interface import flash_attn_varlen_func
spec = json.loads(sys.argv[1]); out = {"import_s": round(time.monotonic() - t0, 3)}
n, hq, hk, d = 16, spec["hq"], spec["hk"], spec["d"]
q = torch.randn(n, hq, d, dtype=torch.bfloat16, device="cuda")
k = torch.randn(n, hk, d, dtype=torch.bfloat16, device="cuda"); v = torch.randn_like(k)
cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
for fa in spec["versions"]:
    try:
        t = time.monotonic()
        flash_attn_varlen_func(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=n,
                               max_seqlen_k=n, causal=True, fa_version=fa)
        torch.cuda.synchronize(); first = time.monotonic() - t
        t = time.monotonic()
        flash_attn_varlen_func(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=n,
                               max_seqlen_k=n, causal=True, fa_version=fa)
        torch.cuda.synchronize()
        out["fa%d" % fa] = {"first_call_s": round(first, 4),
                            "second_call_s": round(time.monotonic() - t, 4)}
    except Exception as e:
        out["fa%d" % fa] = "%s: %s" % (type(e).__name__, str(e)[:200])
out["total_s"] = round(time.monotonic() - t0, 3)
print("FA " + json.dumps(out))
'''


def fa_direct(phase: str, hq: int, hk: int, d: int) -> None:
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-c", FA_SCRIPT, json.dumps(
        {"hq": hq, "hk": hk, "d": d, "versions": [3, 2]})], capture_output=True, text=True,
        timeout=180)
    res = next((json.loads(ln[3:]) for ln in r.stdout.splitlines() if ln.startswith("FA ")),
               {"rc": r.returncode, "stderr": r.stderr[-800:]})
    emit(phase, "fa_direct", heads=[hq, hk], head_dim=d, wall_s=round(time.monotonic() - t, 2),
         **res)


def phase_prewarm() -> None:
    ensure_tiny()
    cache = WORK / "cache2"  # fresh: nothing compiled for this config yet
    conf = watch_config("prewarm", TINY, "tiny", 8102, 9112, cache,
                        {"max-model-len": 2048, "kv-cache-memory-bytes": TINY_KV,
                         "dtype": "bfloat16"})
    t = time.monotonic()
    r = subprocess.run([VLLMWATCH, "prewarm", "--config", str(conf), "--json"],
                       capture_output=True, text=True, timeout=300)
    (LOGS / "prewarm-cmd.log").write_text(r.stdout + "\n---stderr---\n" + r.stderr)
    try:
        rep = json.loads(r.stdout)
    except ValueError:
        rep = {"rc": r.returncode, "stdout": r.stdout[-1500:], "stderr": r.stderr[-1500:]}
    emit("prewarm", "vllmwatch_prewarm", rc=r.returncode, wall_s=round(time.monotonic() - t, 2),
         report=rep)
    # What vLLM itself runs on this GPU (FA3), in a fresh process, for both model shapes.
    fa_direct("prewarm", 2, 1, 64)
    fa_direct("prewarm", 32, 8, 128)
    if left() < 200:
        emit("prewarm", "skipped_restarts", left_s=round(left()))
        return
    emit("prewarm", "start_cold", gpu=wait_idle_gpu(), cache2_mib=du_mib(cache))
    d = Daemon("prewarm", conf, "prewarm-vllmwatch.log")
    try:
        idx, t1, ev = d.ready(0, timeout=420)
        d.start_report("ready_cold", 0, idx, t1, ev)
        if idx < 0 or ev.get("event") != "child.ready":
            raise RuntimeError(f"not READY: {ev.get('event')}")
        emit("prewarm", "cache_after_cold", cache2_mib=du_mib(cache),
             compile_cache_mib=du_mib(cache / "vllm"), triton_mib=du_mib(cache / "triton"))
        time.sleep(2)
        mark = d.log.count()
        ts = d.now()
        d.p.send_signal(signal.SIGUSR1)  # graceful restart of vLLM, caches kept
        idx2, t2, ev2 = d.ready(mark, timeout=300)
        d.start_report("ready_warm_restart", mark, idx2, t2, ev2)
        emit("prewarm", "warm_restart", sigusr1_to_ready_s=round(t2 - ts, 2) if idx2 >= 0
             else None, restart_begin=d.log.named("restart.begin", mark)[:1],
             gpu_release=d.log.named("gpu.released", mark)[:1],
             cache_hits=[ln for ln in d.log.lines if ln[0] >= ts and "Directly load" in ln[1]][:3])
    finally:
        d.stop()


def phase_biggen() -> None:
    ensure_tiny()
    t = time.monotonic()
    r = subprocess.run([sys.executable, str(HERE / "model.py"), str(BIG),
                        "--tokenizer-from", str(TINY)], capture_output=True, text=True,
                       timeout=max(60, min(400, left() - 20)))
    (LOGS / "biggen.log").write_text(r.stdout + r.stderr)
    emit("biggen", "model", rc=r.returncode, seconds=round(time.monotonic() - t, 1),
         out=r.stdout.splitlines()[-2:], err=r.stderr[-500:] if r.returncode else "",
         disk=sh(f"du -sh {BIG}; df -h {WORK} | tail -1"))


def phase_big() -> None:
    if not (BIG / ".complete").is_file():
        phase_biggen()
    cache = WORK / "cache3"
    conf = watch_config("big", BIG, "q8b", 8103, 9113, cache,
                        {"max-model-len": 8192, "gpu-memory-utilization": 0.90,
                         "dtype": "bfloat16"})
    emit("big", "start_cold", gpu=wait_idle_gpu(), cache3_mib=du_mib(cache))
    d = Daemon("big", conf, "big-vllmwatch.log")
    try:
        idx, t1, ev = d.ready(0, timeout=480)
        d.start_report("ready_cold", 0, idx, t1, ev)
        if idx < 0 or ev.get("event") != "child.ready":
            raise RuntimeError(f"not READY: {ev.get('event')}")
        emit("big", "completion", **completion(8103, "q8b", max_tokens=16))
        time.sleep(6)
        memory_view(d, "big")
        emit("big", "cache_after_cold", compile_cache_mib=du_mib(cache / "vllm"),
             triton_mib=du_mib(cache / "triton"))
        if left() > 150:
            mark, ts = d.log.count(), d.now()
            d.p.send_signal(signal.SIGUSR1)
            idx2, t2, ev2 = d.ready(mark, timeout=300)
            d.start_report("ready_warm_restart", mark, idx2, t2, ev2)
            emit("big", "warm_restart", sigusr1_to_ready_s=round(t2 - ts, 2) if idx2 >= 0
                 else None, restart_begin=d.log.named("restart.begin", mark)[:1],
                 gpu_release=d.log.named("gpu.released", mark)[:1])
        if left() > 150:
            d.kill_engine(8103, "q8b")
        else:
            emit("big", "skipped_kill", left_s=round(left()))
    finally:
        d.stop()


PHASES = {"probe0": phase_probe0, "probe": phase_probe, "serve": phase_serve,
          "watch": phase_watch, "prewarm": phase_prewarm, "biggen": phase_biggen,
          "big": phase_big}


def load_state() -> dict[str, Any]:
    try:
        return json.loads(STATE.read_text())
    except (OSError, ValueError):
        return {"done": {}}


def run_phase(name: str, state: dict[str, Any]) -> None:
    t = time.monotonic()
    emit(name, "begin", left_s=round(left()))
    status = "ok"
    try:
        PHASES[name]()
    except Exception as exc:
        status = f"error: {type(exc).__name__}: {exc}"
        emit(name, "error", error=status, tb=traceback.format_exc()[-3000:])
        sweep(name)
    state["done"][name] = {"status": status, "seconds": round(time.monotonic() - t, 1)}
    STATE.write_text(json.dumps(state, indent=1))
    emit(name, "end", status=status, seconds=round(time.monotonic() - t, 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("phases", nargs="+", help="auto, or phase names: " + ", ".join(PHASES))
    ap.add_argument("--budget", type=float, default=540, help="seconds this call may use")
    a = ap.parse_args()
    DEADLINE[0] = T0 + a.budget
    OUT.mkdir(parents=True, exist_ok=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    state = load_state()
    if a.phases == ["auto"]:
        for name in ORDER:
            if name in state["done"]:
                continue
            if left() < EST[name]:
                emit("auto", "stop", next=name, left_s=round(left()), needs_s=EST[name])
                break
            run_phase(name, state)
    else:
        for name in a.phases:
            run_phase(name, state)
    emit("auto", "state", done=state["done"], left_s=round(left()))
    return 0


if __name__ == "__main__":
    # The phase modules beside this file import it as `drive`: one module, one state.
    sys.modules["drive"] = sys.modules["__main__"]
    sys.path.insert(0, str(HERE))
    import phases_gpu  # noqa: F401 - registers its phases in PHASES
    import phases_hang  # noqa: F401 - issue 24's phases

    sys.exit(main())
