"""The child's output: start milestones for the loop, and its lines forwarded to our log.

Reading never waits on the log: a reader thread drains the pipe into a bounded queue and a
writer thread logs from it, dropping (and counting) lines when the journal is too slow, so
vLLM never blocks on a full pipe.
"""

from __future__ import annotations

import collections
import queue
import re
import threading
import time
from collections.abc import Callable
from typing import IO

from vllmwatch.core.events import ChildOutput
from vllmwatch.core.unified import is_memory_line
from vllmwatch.prewarm.runner import compile_cache_hit
from vllmwatch.shell.logs import LogFn

# FACTS.md: vLLM's start milestones, in order; the name is the phase that ends there.
MILESTONES: tuple[tuple[str, str], ...] = (
    ("Starting to load model", "load_start"),
    ("Initializing model took", "model_init"),  # CPU builds
    ("Loading weights took", "weights"),
    ("Model loading took", "model_loaded"),
    ("torch.compile took", "compile"),
    ("Available KV cache memory", "kv_cache"),
    ("CPU KV cache size", "kv_cache"),  # CPU builds
    ("Capturing CUDA graphs", "graphs_start"),
    ("Graph capturing finished", "graphs"),
    ("init engine", "engine_init"),
    ("Starting vLLM server on", "server_start"),
    ("Application startup complete", "api_ready"),
)
_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b")
_LEVEL_MAP = {"DEBUG": "debug", "INFO": "info", "WARNING": "warning", "WARN": "warning",
              "ERROR": "error", "CRITICAL": "error"}
# Our own successful probes in vLLM's access log: 17k lines a day of noise, not forwarded.
_OWN_PROBE = re.compile(r'"GET /(health|metrics) HTTP/1\.[01]" 200')
PROGRESS_EVERY = 0.5  # at most this often a plain line is posted to the loop as progress


def milestone_of(line: str) -> str | None:
    """The start phase a line marks, if any."""
    for needle, name in MILESTONES:
        if needle in line:
            if name == "engine_init" and "took" not in line:
                continue
            return name
    return None


def level_of(line: str, previous: str) -> str:
    """The log level of a vLLM line; a traceback continues at error level."""
    match = _LEVEL.search(line[:80])
    if match:
        return _LEVEL_MAP[match.group(1)]
    if line.startswith("Traceback") or (previous == "error" and line[:1] in (" ", "\t")):
        return "error"
    if re.match(r"^\w*(Error|Exception)\b", line) or line.startswith("vllm: error"):
        return "error"
    return "info"


class ChildLog:
    """Reads one child's output; posts ChildOutput events; forwards lines to the log."""

    def __init__(self, stream: IO[bytes], pid: int, post: Callable[[ChildOutput], None],
                 log: LogFn, forward: bool = True, capacity: int = 10000,
                 tail_lines: int = 300) -> None:
        self._stream, self._pid, self._post, self._log = stream, pid, post, log
        self._forward = forward
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue(maxsize=capacity)
        self.last_lines: collections.deque[str] = collections.deque(maxlen=30)
        # The longer tail an incident record keeps ([incidents] output_lines).
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        # Memory-failure lines of the whole run (core/unified.py): vLLM's traceback after
        # them can be longer than last_lines.
        self.memory_lines: collections.deque[str] = collections.deque(maxlen=5)
        self.dropped = 0
        self._reader = threading.Thread(target=self._read, name=f"child-{pid}-reader",
                                        daemon=True)
        self._writer = threading.Thread(target=self._write, name=f"child-{pid}-writer",
                                        daemon=True)

    def start(self) -> None:
        """Start both threads."""
        self._writer.start()
        self._reader.start()

    def join(self, timeout: float = 0.3) -> None:
        """Wait briefly for the pipe to drain after the child exited.

        Orphans (EngineCore, workers) may hold the pipe open for ever: one short shared
        deadline, never a long wait in the loop; the sweep kills them and closes the pipe.
        """
        deadline = time.monotonic() + timeout
        self._reader.join(max(0.0, deadline - time.monotonic()))
        self._writer.join(max(0.0, deadline - time.monotonic()))

    def _read(self) -> None:
        level = "info"
        last_post = 0.0
        try:
            for raw in iter(self._stream.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if not line.strip():
                    continue
                level = level_of(line, level)
                self.last_lines.append(line)
                self.tail.append(line)
                if is_memory_line(line):
                    self.memory_lines.append(line)
                milestone, hit = milestone_of(line), compile_cache_hit(line)
                now = time.monotonic()
                if milestone or hit or now - last_post >= PROGRESS_EVERY:
                    self._post(ChildOutput(milestone, hit))
                    last_post = now
                if self._forward and not _OWN_PROBE.search(line):
                    try:
                        self._queue.put_nowait((level, line))
                    except queue.Full:
                        self.dropped += 1
        except (OSError, ValueError):
            pass  # the pipe closed under us
        finally:
            self._queue.put(None)

    def _write(self) -> None:
        reported = 0
        while True:
            item = self._queue.get()
            if item is None:
                break
            level, line = item
            self._log(level, "child.line", pid=self._pid, text=line)
            if self.dropped > reported:
                self._log("warning", "child.lines_dropped", pid=self._pid,
                          count=self.dropped - reported,
                          detail="the log could not keep up; vLLM was not slowed down")
                reported = self.dropped
