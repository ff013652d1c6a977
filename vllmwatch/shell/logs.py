"""Logging: events as native journal entries with fields, or one line each (JSON, console).

Under journald each event is an entry with VLLMWATCH_* fields (shell/journal.py); where the
native socket is missing or a send fails, the same event goes to stderr as a `<N>` line.
Every line written to a stream shows its control characters as escapes (`one_line`): vLLM's
forwarded lines and any field may carry them, and raw they forge entries (journald's stdout
stream splits at NUL and reads a `<N>` prefix per piece) or drive the operator's terminal.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import IO, Any

import structlog

from vllmwatch.config.convert import printable
from vllmwatch.config.redact import REDACT
from vllmwatch.logfn import LogFn

__all__ = ["LogFn", "setup"]

from vllmwatch.shell import journal

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}
# What json.dumps(ensure_ascii=False) leaves raw that a terminal may act on: DEL and the C1
# controls (U+009B is CSI), the line separators and bidi overrides (printable's list). It
# escapes U+0000-U+001F itself.
_JSON_RAW = re.compile(r"[\x7f-\x9f\u2028-\u202e\u2066-\u2069]")


def one_line(text: str) -> str:
    """`text` as one line safe for a stream: every C0/C1 control character but tab, newline
    included, as a visible escape (a NUL or a newline would start a new journal entry, `\\r`
    or ESC would rewrite the operator's terminal)."""
    return printable(text).replace("\n", "\\n")


def under_journald(environ: Mapping[str, str], stream: IO[str]) -> bool:
    """True when stderr is connected to journald (JOURNAL_STREAM names its device:inode)."""
    value = environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return st.st_dev == dev and st.st_ino == ino


def choose_format(wanted: str, environ: Mapping[str, str], stream: IO[str]) -> str:
    """Resolve "auto": journal under journald, console on a TTY, else JSON (containers)."""
    if wanted != "auto":
        return wanted
    if under_journald(environ, stream):
        return "journal"
    return "console" if stream.isatty() else "json"


def _kv(fields: Mapping[str, Any]) -> str:
    parts = []
    for key, value in fields.items():
        if isinstance(value, str):
            text = value if value and " " not in value and '"' not in value and "=" not in \
                value else json.dumps(value, ensure_ascii=False)
        else:
            text = json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))
        parts.append(f"{key}={text}")
    return " ".join(parts)


def message_text(name: str, fields: Mapping[str, Any]) -> str:
    """The human text of an event: `name key=value ...`; vLLM's own lines marked `vllm|`."""
    if name == "child.line":  # the spare engine's lines: `vllm spare|` (shell/sparetree.py)
        engine = f" {fields['engine']}" if fields.get("engine") else ""
        build = f" build={fields['build']}" if fields.get("build") else ""
        return f"vllm{engine}{build}| {fields.get('text', '')}"
    return f"{name} {_kv(fields)}".rstrip()


class Renderer:
    """Render one event dict to one line in the chosen format."""

    def __init__(self, fmt: str, color: bool = False) -> None:
        self.fmt = fmt
        self.color = color

    def __call__(self, _logger: Any, _name: str, event: MutableMapping[str, Any]) -> str:
        """structlog's renderer protocol."""
        level = event.pop("level", "info")
        name = event.pop("event", "")
        stamp = event.pop("timestamp", None)
        if self.fmt == "json":
            line = json.dumps({"ts": stamp, "level": level, "event": name, **event},
                              ensure_ascii=False, default=str)
            # Only inside JSON strings (JSON's own syntax is ASCII): \u00XX reads back the same.
            return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", line)
        body = one_line(message_text(name, event))
        if self.fmt == "journal":
            return f"<{_PRIORITY.get(level, 6)}>{body}"
        clock = time.strftime("%H:%M:%S", time.localtime(stamp or time.time()))
        tag = level.upper()[:4]
        if self.color:
            colour = {"WARN": "33", "ERRO": "31", "CRIT": "31", "DEBU": "2"}.get(tag, "32")
            tag = f"\x1b[{colour}m{tag}\x1b[0m"
        return f"{clock} {tag} {body}"


class _Writer:
    """A line writer that never interleaves two lines from different threads."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def msg(self, message: str) -> None:
        with self._lock:
            try:
                self._stream.write(message + "\n")
                self._stream.flush()
            except (OSError, ValueError):
                pass  # stderr gone (journald restarted): never crash the supervisor on it

    log = debug = info = warning = error = critical = msg


def setup(fmt: str = "auto", level: str = "info", stream: IO[str] | None = None,
          environ: Mapping[str, str] | None = None,
          journal_socket: str = journal.SOCKET) -> LogFn:
    """Configure structlog and return log(level, event, **fields).

    In the journal format, events go to `journal_socket` as native entries while it exists.
    """
    out = stream if stream is not None else sys.stderr
    env = os.environ if environ is None else environ
    resolved = choose_format(fmt, env, out)
    color = resolved == "console" and out.isatty() and "NO_COLOR" not in env
    writer = _Writer(out)
    threshold = LEVELS.get(level, 20)
    structlog.configure(
        processors=[structlog.processors.TimeStamper(fmt=None), Renderer(resolved, color)],
        logger_factory=lambda *_: writer,
        cache_logger_on_first_use=False,
    )
    logger = structlog.get_logger()
    native = journal.JournalSender(journal_socket) if (
        resolved == "journal" and journal.available(journal_socket)) else None

    def log(level: str, event: str, **fields: Any) -> None:
        if LEVELS.get(level, 20) < threshold:
            return
        # Everything logged passes the one redactor: child.started's command and
        # environment, vLLM's lines, errors quoting a URL (config/redact.py).
        fields = REDACT.deep(fields)
        if native is not None and native.send(journal.encode(journal.entry_fields(
                level, event, message_text(event, fields), fields))):
            return
        logger.msg(event, level=level, **fields)  # no journal: the same event on stderr

    logging.root.handlers = [Bridge(log)]  # a reload's setup replaces, never stacks
    logging.root.setLevel(logging.WARNING)
    return log


LIBRARY_EVERY = 60.0  # one library.message per logger per this many seconds, with a count


# aiohttp's parse errors quote the client's raw bytes (`b'Bearer\ttok_...'`), in shapes no
# redactor rule can know (a folded or tab-separated header): the quote is never logged.
_RAW_QUOTE = re.compile(r"""b(['"]).*""", re.DOTALL)


def _quoting_not(exc: BaseException) -> str:
    """An exception's text; for an HTTP parse error, on one line, without the quoted
    request bytes or the caret under them."""
    text = str(exc)
    if type(exc).__module__.startswith("aiohttp.http"):
        lines = (line.strip() for line in text.splitlines())
        text = " ".join(_RAW_QUOTE.sub("(the request's bytes, not shown)", line)
                        for line in lines if line and line.strip("^ ~"))
    return text


class Bridge(logging.Handler):
    """Records of the libraries' stdlib loggers (aiohttp's server quotes a request it cannot
    parse, its headers included): without a handler they reach stderr through logging's
    lastResort, unredacted and with a traceback. Here they become `library.message` events
    through the one redactor, with the exception's type and text and no traceback, at most
    one per logger per LIBRARY_EVERY seconds (a client can send bad requests in a loop)."""

    def __init__(self, log: LogFn, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(logging.WARNING)
        self._log, self._clock = log, clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            now, name = self._clock(), record.name
            if now - self._last.get(name, float("-inf")) < LIBRARY_EVERY:
                self._held[name] = self._held.get(name, 0) + 1
                return
            self._last[name] = now
            fields: dict[str, Any] = {"logger": name, "message": record.getMessage()}
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                fields["error"] = f"{type(exc).__name__}: {_quoting_not(exc)}"
            fields["since_last"] = self._held.pop(name, 0)  # not logged in between
            level = "error" if record.levelno >= logging.ERROR else "warning"
            self._log(level, "library.message", **fields)
        except Exception:  # a log line never takes the daemon down, nor prints a traceback
            return
