"""`vllmwatch run` on the GPU machine: the shared harness (vllmwatch/testing/daemon.py) in a
session of its own, every line timestamped into a log file, vLLM's start milestones kept."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from bench.gpu.procs import descendants, survivors, title, tree, vllm_like
from bench.gpu.run import Run
from vllmwatch.testing.daemon import Daemon, Event, run_argv

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
Found = tuple[int, float, Event]  # (index, seconds since start, event); (-1, -1.0, {}) if not


class LineNotes:
    """vLLM's milestones (first time each was seen) and its interesting lines, with the
    seconds since t0; every line also goes, timestamped, to a file."""

    def __init__(self, path: Path, t0: float) -> None:
        self.t0 = t0
        self.fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed with the process
        self.lines: list[tuple[float, str]] = []
        self.first: dict[str, float] = {}
        self.lock = threading.Lock()

    def note(self, now: float, line: str, text: str) -> None:
        t = now - self.t0
        self.fh.write(f"{t:9.2f} {line}\n")
        self.fh.flush()
        if not text:
            return
        with self.lock:
            for m in MILESTONES:
                if m in text and m not in self.first:
                    self.first[m] = round(t, 2)
            if INFO_RE.search(text):
                self.lines.append((round(t, 2), text[-260:]))

    def close(self) -> None:
        self.fh.close()


class GpuDaemon:
    """One `vllmwatch run` of a phase; its vLLM sessions become the run's own."""

    def __init__(self, run: Run, phase: str, conf: Path, logname: str,
                 env: dict[str, str] | None = None) -> None:
        """env: variables added to ours for vllmwatch (and so its vLLM), e.g.
        STATE_DIRECTORY for where incident records go."""
        self.run, self.phase, self.conf = run, phase, conf
        self.t0 = time.monotonic()
        self.notes = LineNotes(run.logs / logname, self.t0)
        self.d = Daemon(run.work, conf, env=None if env is None else {**os.environ, **env},
                        notify=False, own_session=True, on_line=self._line,
                        argv=run_argv(conf, run.vllmwatch), checkout_path=False).start()
        run.own(self.pid)

    def _line(self, now: float, line: str, ev: Event | None) -> None:
        if ev is not None and ev.get("event") == "child.started" and \
                isinstance(ev.get("pid"), int):
            self.run.own_sids.add(ev["pid"])  # vllmwatch starts each vLLM in a new session
        text = line if ev is None else (ev.get("text", "") if ev.get("event") == "child.line"
                                        else "")
        self.notes.note(now, line, text)

    @property
    def pid(self) -> int:
        return self.d.pid

    @property
    def lines(self) -> list[tuple[float, str]]:
        return self.notes.lines

    def now(self) -> float:
        return time.monotonic() - self.t0

    def send(self, sig: int) -> float:
        """Signal vllmwatch; the seconds since its start when sent."""
        t = self.now()
        self.d.signal(sig)
        return t

    def count(self) -> int:
        return self.d.mark()

    def named(self, name: str, since: int = 0, until: int | None = None) -> list[Event]:
        """Events called name in [since, until), each with "t": seconds since the start."""
        d = self.d
        pairs = list(zip(list(d.arrived), list(d.events), strict=False))[since:until]
        return [{"t": round(t - self.t0, 2), **{k: v for k, v in ev.items() if k != "ts"}}
                for t, ev in pairs if ev.get("event") == name]

    def wait(self, pred: Any, since: int = 0, timeout: float = 60) -> Found:
        """First event from index since on that satisfies pred, within timeout (and the
        run's time left): (index, seconds since start, event), or (-1, -1.0, {})."""
        end = time.monotonic() + max(0.0, min(timeout, self.run.left() - 10))
        while True:
            # Whether it is over, taken before the look: an exit whose last events the reader
            # read meanwhile still finds them (its daemon.exit, say).
            over = time.monotonic() >= end or self.d.exited()
            idx = self.d.first(pred, since)
            if idx is not None:
                return idx, round(self.d.arrived[idx] - self.t0, 2), self.d.events[idx]
            if over:
                return -1, -1.0, {}
            time.sleep(0.1)

    def ready(self, since: int = 0, timeout: float = 600) -> Found:
        """child.ready, or what ended the wait instead (daemon.exit, a crash loop)."""
        return self.wait(lambda e: e.get("event") in ("child.ready", "daemon.exit")
                         or str(e.get("event", "")).startswith("crashloop"), since, timeout)

    def status(self) -> dict[str, Any]:
        r = subprocess.run([*self.run.vllmwatch, "status", "--json", "--config",
                            str(self.conf)], capture_output=True, text=True, timeout=30)
        try:
            out: dict[str, Any] = json.loads(r.stdout)
            return out
        except ValueError:
            return {"rc": r.returncode, "out": (r.stdout + r.stderr)[-500:]}

    def start_report(self, what: str, since: int, found: Found) -> None:
        """One line per start: READY time, vllmwatch's start phases, vLLM's own milestones."""
        idx, t, ev = found
        t_since = self.named_at(since)
        self.run.emit(
            self.phase, what, ready_at_s=t, ready_event=ev,
            startup_phases=[{k: e.get(k) for k in ("t", "phase", "at_s")}
                            for e in self.named("startup.phase", since, idx + 1)],
            prewarm=[{k: e.get(k) for k in ("t", "step", "status", "seconds", "detail")}
                     for e in self.named("prewarm.step", since, idx + 1)],
            child_started=self.named("child.started", since, idx + 1)[-1:],
            vllm_lines=[ln for ln in self.lines if ln[0] >= t_since][:25])

    def named_at(self, idx: int) -> float:
        """The seconds since start at which event idx came (0 when there is none)."""
        arrived = self.d.arrived
        return arrived[idx] - self.t0 if 0 <= idx < len(arrived) else 0.0

    def stop(self, sweep_after: bool = True) -> None:
        """SIGTERM vllmwatch: exit code, time, leftovers, GPU memory; then sweep what is ours
        (sweep_after=False when another daemon of ours still runs)."""
        run = self.run
        code, took = self.d.stop(max(30.0, min(90.0, run.left())))
        self.notes.close()
        run.pause(1)
        run.emit(self.phase, "sigterm_vllmwatch", exit_code=code, seconds=took,
                 leftovers=run.ours(), vllm_like_anywhere=vllm_like(),
                 gpu_after=run.nv.snapshot(),
                 nvidia_smi=run.sh("nvidia-smi --query-gpu=memory.used --format=csv,noheader;"
                                   " nvidia-smi --query-compute-apps=pid,used_memory "
                                   "--format=csv,noheader"),
                 daemon_exit=self.named("daemon.exit")[-1:],
                 stopping=[{k: e.get(k) for k in ("t", "event", "reason", "code", "signal")}
                           for e in self.named("child.stopping") + self.named("child.kill")
                           + self.named("child.exited")][-4:])
        if sweep_after:
            run.sweep(self.phase)

    def stop_and_check(self, sweep_after: bool = True) -> None:
        """stop(), then: nothing of its tree left (at +1 s, +5 s), every GPU back to idle."""
        old = tree(self.pid)
        self.stop(sweep_after)
        self.run.pause(1)
        at1 = survivors(old)
        if at1:
            self.run.pause(4)
        self.run.emit(self.phase, "after_stop", old_tree_size=len(old), alive_after_1s=at1,
                      alive_after_5s=survivors(old) if at1 else [],
                      gpu=self.run.wait_idle_gpu(30) if sweep_after else self.run.nv.snapshot())

    def memory_view(self) -> None:
        """vllmwatch status --json next to NVML's own per-process view of the tree."""
        st = self.status()
        pids = [self.pid, *descendants(self.pid)]
        nv = self.run.nv.snapshot()
        ours = sum(p["mib"] for p in nv.get("procs", []) if p["pid"] in pids)
        self.run.emit(self.phase, "status_json", status=st)
        self.run.emit(self.phase, "memory_vs_nvml",
                      vllmwatch_source=st.get("memory", {}).get("source"),
                      vllmwatch_gpu_tree_mib=st.get("memory", {}).get("gpu_tree_mib"),
                      nvml_tree_mib=ours, nvml=nv,
                      tree=[{"pid": x, "title": title(x)} for x in pids])

    def events_after(self, mark: int, t_fault: float, *names: str) -> dict[str, Any]:
        """First event of each name after the mark, its time relative to the fault."""
        out: dict[str, Any] = {}
        for name in names:
            evs = self.named(name, mark)
            if evs:
                e = evs[0]
                out[name] = {**{k: e.get(k) for k in ("reason", "detail", "code", "signal",
                                                      "message", "pids", "rule") if k in e},
                             "after_fault_s": round(e["t"] - t_fault, 2)}
        return out
