"""One driver run: its deadline, the process groups and sessions it owns, NVML, where its
results go, and the commands it runs. Built once by drive.py (or a dry run) and passed to
every phase: nothing here is module state.

Only what this run started is ever killed: the process groups of its own children (plain
`vllm serve`, `vllmwatch run`) and the sessions vllmwatch creates for each vLLM it launches
(child.started pid = session id; vLLM's EngineCore and workers keep that session even when
orphaned). Other processes are listed in reports, never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu.nvml import Nvml
from bench.gpu.procs import ids, state, title
from vllmwatch.testing.ports import free_port

HERE = Path(__file__).resolve().parent
# The tiny model needs 512 bytes of KV cache a token: left to gpu-memory-utilization it would get
# ~120 GiB (hundreds of millions of tokens, millions of block objects). 2 GiB is 4M tokens.
TINY_KV = 2 * 2**30


@dataclass
class Run:
    """What a phase needs from its run. `dry`: the fake vLLM and fake NVML on a machine
    without a GPU (models are stamp files, waits shrink by time_scale, ports are free ones)."""

    out: Path  # summary.jsonl (what comes back)
    work: Path  # models, caches, configs, logs, state.json
    vw_src: Path  # the checkout: scripts/make_tiny_model.py
    vllm: list[str]  # the vLLM command (`serve` follows)
    vllmwatch: list[str]
    nv: Nvml
    deadline: float
    dry: bool = False
    time_scale: float = 1.0
    t0: float = field(default_factory=time.monotonic)
    own_pgids: set[int] = field(default_factory=set)
    own_sids: set[int] = field(default_factory=set)
    ports: dict[int, int] = field(default_factory=dict)
    my_start: int = field(default_factory=lambda: (ids(os.getpid()) or (0, 0, 0))[2])

    @classmethod
    def from_env(cls, budget: float) -> Run:
        """The GPU machine's run, from vllm_h200.sh's environment."""
        bin_dir = Path(sys.executable).parent
        vllm = os.environ.get("VLLM_H200_VLLM") or shutil.which("vllm") or str(bin_dir / "vllm")
        vw = os.environ.get("VLLM_H200_VLLMWATCH") or shutil.which("vllmwatch") or str(
            bin_dir / "vllmwatch")
        return cls(out=Path(os.environ.get("OUT") or "/tmp/vllm_h200_out"),
                   work=Path(os.environ.get("VLLM_H200_WORK") or "/tmp/vllm_h200"),
                   vw_src=Path(os.environ.get("VLLM_H200_VW_SRC") or Path.cwd()),
                   vllm=[vllm], vllmwatch=[vw], nv=Nvml.real(),
                   deadline=time.monotonic() + budget)

    # ---- places ----

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    @property
    def tiny(self) -> Path:
        return self.work / "models" / "tiny"

    @property
    def big(self) -> Path:
        return self.work / "models" / "qwen3-8b-shape"

    def port(self, n: int) -> int:
        """vLLM port n of the plan (8100 + n); any free one when dry."""
        return self._port(8100 + n)

    def status_port(self, n: int) -> int:
        """Status port n of the plan (9110 + n); any free one when dry."""
        return self._port(9110 + n)

    def _port(self, planned: int) -> int:
        if planned not in self.ports:
            self.ports[planned] = free_port() if self.dry else planned
        return self.ports[planned]

    # ---- time ----

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def pause(self, seconds: float) -> None:
        """A measured wait (memory samples, a baseline, load): shrinks with time_scale."""
        time.sleep(seconds * self.time_scale)

    # ---- output ----

    def emit(self, phase: str, what: str, **fields: Any) -> dict[str, Any]:
        """One measurement: printed as '## {...}', appended to summary.jsonl."""
        rec = {"t": round(time.monotonic() - self.t0, 2), "phase": phase, "what": what,
               **fields}
        line = json.dumps(rec, default=str)
        print("## " + line, flush=True)
        for path in (self.out / "summary.jsonl", self.work / "summary-all.jsonl"):
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        return rec

    def sh(self, cmd: str, timeout: float = 60) -> str:
        """A shell command's output (stdout and stderr), for reports; on timeout its whole
        process group is killed (not only the shell)."""
        p = subprocess.Popen(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=timeout)
            return out.strip()
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            return f"timeout after {timeout}s"

    def cmd(self, argv: list[str]) -> str:
        """argv as one shell word list (for sh)."""
        return shlex.join(argv)

    # ---- processes ----

    def own(self, pid: int) -> None:
        """A process group this run started (its leader's pid)."""
        self.own_pgids.add(pid)

    def ours(self) -> list[dict[str, Any]]:
        """Processes in our groups or sessions, started after this run (never an older one)."""
        out = []
        for p in os.listdir("/proc"):
            if not p.isdigit() or int(p) == os.getpid():
                continue
            g = ids(int(p))
            if g and g[2] >= self.my_start and (g[0] in self.own_pgids
                                                 or g[1] in self.own_sids):
                out.append({"pid": int(p), "title": title(int(p)), "state": state(int(p))})
        return out

    def sweep(self, phase: str) -> list[dict[str, Any]]:
        """SIGKILL, by pid, what is left of the process groups and sessions we started."""
        found = self.ours()
        for p in found:
            with contextlib.suppress(OSError):
                os.kill(p["pid"], signal.SIGKILL)
        if found:
            self.emit(phase, "sweep_killed", processes=found)
            self.pause(1)
        return found

    def wait_idle_gpu(self, limit: float = 60) -> dict[str, Any]:
        """Wait until NVML lists no process (the previous phase's memory is back)."""
        t = time.monotonic()
        while time.monotonic() - t < limit and self.nv.ok and self.nv.procs():
            time.sleep(0.5)
        return {"waited_s": round(time.monotonic() - t, 2), **self.nv.snapshot()}
