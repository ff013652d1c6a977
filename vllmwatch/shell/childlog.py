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
from collections.abc import Callable, Iterator
from typing import IO

from vllmwatch.config.redact import EXCERPT_MARGIN, REDACT
from vllmwatch.core import reuse
from vllmwatch.core.events import ChildOutput
from vllmwatch.core.unified import is_memory_line
from vllmwatch.incident import cause
from vllmwatch.incident.cause import EXCEPTION
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
# Forwarded lines: journald's default limit is 10,000 entries per 30 s per unit; 2,000 at once
# then 200 a second stays under it (8,000 per 30 s) with room for our own events.
RATE, BURST = 200.0, 2000.0
MAX_LINE = 16 * 1024  # bytes of one line; a longer one is cut (a line without end is a leak)
DROP_REPORT_EVERY = 10.0


def milestone_of(line: str) -> str | None:
    """The start phase a line marks, if any."""
    for needle, name in MILESTONES:
        if needle in line:
            if name == "engine_init" and "took" not in line:
                continue
            return name
    return None


def level_of(line: str, previous: str) -> str:
    """The log level of a vLLM line: its logger's level word, else an error line as the
    incident's cause line reads it (`(EngineCore_DP0 pid=8) torch.OutOfMemoryError: ...`,
    `[rank0]: ...NCCL error`, `Fatal Python error`: `journalctl -p err` missed them); a
    traceback's frames continue at error level."""
    match = _LEVEL.search(line[:80])
    if match:
        return _LEVEL_MAP[match.group(1)]
    text = cause.body(line)
    if (previous == "error" and text[:1] in (" ", "\t")) or cause.is_error(line) or \
            EXCEPTION.match(text) or line.startswith("vllm: error"):
        return "error"
    return "info"


class Bucket:
    """A token bucket: `rate` lines a second on average, `burst` at once (not thread-safe)."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.at = rate, burst, burst, now

    def take(self, now: float) -> bool:
        """Whether one more line may pass now."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class ChildLog:
    """Reads one child's output; posts ChildOutput events; forwards lines to the log.

    Every line is looked at (milestones, last_lines, memory lines: the diagnosis never
    misses one), but at most RATE lines a second (BURST at once) are forwarded, so a child
    printing megabytes a second cannot flood the journal past its rate limit and drown our
    own events; what was not forwarded is counted in `child.lines_dropped` (at most one
    event per DROP_REPORT_EVERY s). A line longer than MAX_LINE is cut there.
    """

    def __init__(self, stream: IO[bytes], pid: int, post: Callable[[ChildOutput], None],
                 log: LogFn, forward: bool = True, capacity: int = 10000,
                 rate: float = RATE, burst: float = BURST,
                 clock: Callable[[], float] = time.monotonic, tail_lines: int = 300,
                 engine: str | None = None, build: int = 0) -> None:
        self._stream, self._pid, self._post, self._log = stream, pid, post, log
        # Which engine printed it, on each forwarded line: "spare" for the sleeping spare
        # (shell/sparetree.py) with its build's number (its events' build=); nothing for the
        # serving child, whose lines stay as they were.
        self._tag: dict[str, object] = {"engine": engine} if engine else {}
        if engine and build:
            self._tag["build"] = build
        self._forward = forward
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue(maxsize=capacity)
        self.last_lines: collections.deque[str] = collections.deque(maxlen=30)
        # The longer tail an incident record keeps ([incidents] output_lines).
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        # Memory-failure and full-disk lines of the whole run (core/unified.py, reuse.py):
        # vLLM's traceback after them can be longer than last_lines.
        self.memory_lines: collections.deque[str] = collections.deque(maxlen=5)
        self.dropped = 0  # lines not forwarded: the log was too slow (queue full)
        self.limited = 0  # lines not forwarded: over the rate
        self.cut = 0  # lines longer than MAX_LINE, cut there
        self.failed = 0  # lines our readers raised on (kept in the tail, not read for facts)
        self.told_to_stop = ""  # vLLM's words when a signal started its shutdown (cause.py)
        self._before = ""  # the line before, for the redactor's two-line forms (REDACT.after)
        self._clock = clock
        self._bucket = Bucket(rate, burst, clock())
        self._reported = (0, 0, 0)
        self._next_report = 0.0
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

    def _lines(self) -> Iterator[str]:
        """The child's lines, each at most MAX_LINE bytes (the rest of a longer one skipped)."""
        readline = self._stream.readline
        skipping = False
        while True:
            raw = readline(MAX_LINE + 1)
            if not raw:
                return
            whole = raw.endswith(b"\n")
            if skipping:  # the tail of a cut line
                skipping = not whole
                continue
            if not whole and len(raw) > MAX_LINE:
                self.cut += 1
                # Redacted over a window past the cut, then cut (Redactor.head): a secret
                # across the 16 KiB mark would otherwise leave its first part unmatched.
                more = readline(EXCERPT_MARGIN)
                skipping = bool(more) and not more.endswith(b"\n")
                line = REDACT.head(raw + more, MAX_LINE) + " [cut: line over 16 KiB]"
            else:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if "\r" in line:  # a progress bar redrawn with \r (tqdm, to a pipe): what a
                # terminal shows, its last draw, not every draw in one escaped line
                line = next((d for d in reversed(line.split("\r")) if d.strip()), "")
            if line.strip():
                yield line

    def _read(self) -> None:
        level = "info"
        last_post = 0.0
        try:
            for line in self._lines():
                try:
                    level, last_post = self._take(line, level, last_post)
                except Exception as exc:
                    # One line our readers choke on (a client's prompt echoed by vLLM's
                    # request log) must not end the reading: vLLM would block on a full
                    # pipe and be restarted for a "deadlock". Said once, then counted.
                    self.failed += 1
                    if self.failed == 1:
                        self._log("error", "child.line_unread", error=REDACT.head(
                                  f"{type(exc).__name__}: {exc}", 300),
                                  line=REDACT.head(line, 200), **self._tag,
                                  hint="a vllmwatch bug reading this line (kept for the "
                                  "incident record); the reading goes on; please report it")
                    if not self.tail or self.tail[-1] is not line:
                        self.tail.append(line)
        except (OSError, ValueError):
            pass  # the pipe closed under us
        finally:
            self._queue.put(None)

    def _take(self, line: str, level: str, last_post: float) -> tuple[str, float]:
        before, self._before = self._before, line
        if "value" in line and "name" in before:  # `- name: HF_TOKEN` / `  value: X` (YAML):
            line = REDACT.after(before, line)  # no writer sees the two lines together
        if not cause.is_exit_noise(line):  # before any limit: the diagnosis sees all but
            self.last_lines.append(line)  # what every exit prints (child.exited's lines)
        self.tail.append(line)  # ... and so does an incident record
        if not self.told_to_stop:
            self.told_to_stop = cause.told_to_stop(line, self._pid)
            if self.told_to_stop:  # the core ends a serving run at once (core/serving.py)
                self._post(ChildOutput(told_to_stop=self.told_to_stop, pid=self._pid))
        level, now = level_of(line, level), self._clock()
        if self._forward and not _OWN_PROBE.search(line):
            self._offer(level, line, now)
        if is_memory_line(line) or reuse.disk_full_line(line):  # (a full disk: child.disk_full)
            self.memory_lines.append(line)
        milestone, hit = milestone_of(line), compile_cache_hit(line)
        facts = reuse.facts_of(line)
        if milestone or hit or facts or now - last_post >= PROGRESS_EVERY:
            self._post(ChildOutput(milestone, hit, facts))
            last_post = now
        return level, last_post

    def _offer(self, level: str, line: str, now: float) -> None:
        if not self._bucket.take(now):
            self.limited += 1
            return
        try:
            self._queue.put_nowait((level, line))
        except queue.Full:
            self.dropped += 1

    def _write(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            level, line = item
            self._log(level, "child.line", pid=self._pid, **self._tag, text=line)
            self._report(force=False)
        self._report(force=True)

    def _report(self, force: bool) -> None:
        """Log what was not forwarded, at most once per DROP_REPORT_EVERY s (with counts)."""
        counts = (self.dropped, self.limited, self.cut)
        now = self._clock()
        if counts == self._reported or (not force and now < self._next_report):
            return
        slow, rate, cut = (a - b for a, b in zip(counts, self._reported, strict=True))
        self._reported, self._next_report = counts, now + DROP_REPORT_EVERY
        self._log("warning", "child.lines_dropped", pid=self._pid, **self._tag,
                  count=slow + rate, over_rate=rate, log_too_slow=slow, cut_long=cut,
                  rate_per_s=self._bucket.rate,
                  detail="vLLM printed more than is forwarded; it was not slowed down, and "
                         "its last lines are still kept for the exit diagnosis")
