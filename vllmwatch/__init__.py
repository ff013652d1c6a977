"""vllmwatch: a systemd-supervised watchdog that keeps one vLLM server healthy.

The package also pins its own code for a running daemon (`pin`): a package upgrade (the .deb's
postinst leaves a running vllmwatch alone) replaces these files under a daemon that imports
some of them only when a feature is first used (the spare's failover, LoRA, the smoke test,
hours later) and runs two of them in other interpreters (the standby's script, the incident
hook). New files beside old modules in memory are two versions in one process, and the first
call across them can crash the daemon at 3 a.m. Pinned, a daemon runs the code it started with,
all of it, until it is restarted; `code_changed` says when the files moved on.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, TextIO, cast

__version__ = "0.1.0"

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCES: dict[str, tuple[str, bytes]] = {}  # module name -> (file, its bytes at the pin)
_BY_FILE: dict[str, bytes] = {}
_STATS: dict[str, tuple[int, int, int]] = {}  # file -> (inode, size, mtime_ns) at the pin
_VERSION = re.compile(rb"""^__version__ = ["']([^"']+)["']""", re.MULTILINE)


class _PinnedFinder:
    """Serves vllmwatch's modules not yet imported from the bytes read at the pin, where the
    file on disk is no longer the one read then."""

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        got = _SOURCES.get(name)
        if got is None or not _moved(got[0]):
            return None  # unchanged on disk: the normal import, with its .pyc (postinst's)
        package = os.path.basename(got[0]) == "__init__.py"
        # (a loader by its methods: importlib.abc would cost every CLI call ~9 ms of imports)
        spec = importlib.util.spec_from_loader(name, cast(Any, self), origin=got[0],
                                               is_package=package)
        if spec is not None:
            spec.has_location = True  # __file__ is the file's path, as for a plain import
            if package:
                spec.submodule_search_locations = [os.path.dirname(got[0])]
        return spec

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        file, source = _SOURCES[module.__name__]
        _freeze_lines()
        exec(compile(source, file, "exec", dont_inherit=True), module.__dict__)

    def get_source(self, name: str) -> str | None:
        """For tracebacks (linecache): the pinned lines, not those of a newer file."""
        got = _SOURCES.get(name)
        return got[1].decode("utf-8", "replace") if got is not None else None


_FROZEN: list[bool] = []


def _freeze_lines() -> None:
    """Once files moved: tracebacks quote the lines that run, not the newer files' (an entry
    without an mtime is one linecache never re-reads). Not at the pin: ~3 MB for every daemon
    against a rare upgrade; every path that learns of one calls this first."""
    if _FROZEN:
        return
    _FROZEN.append(True)
    import linecache

    for file, data in _BY_FILE.items():
        lines = data.decode("utf-8", "replace").splitlines(keepends=True)
        linecache.cache[file] = (len(data), None, lines, file)


def pin() -> int:
    """Read every module of the package now and serve later imports from these bytes (a
    daemon's start, before its lazy imports); returns how many files were pinned. Idempotent."""
    if _SOURCES:
        return len(_SOURCES)
    for folder, dirs, files in os.walk(_HERE):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if not name.endswith(".py"):
                continue
            file = os.path.join(folder, name)
            rel = os.path.relpath(file, os.path.dirname(_HERE))[:-3].split(os.sep)
            module = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
            try:
                with open(file, "rb") as f:
                    stat, data = os.fstat(f.fileno()), f.read()
            except OSError:
                continue  # unreadable now: imported from disk as before
            _SOURCES[module], _BY_FILE[file] = (file, data), data
            _STATS[file] = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if _SOURCES:
        sys.meta_path.insert(0, _PinnedFinder())
    return len(_SOURCES)


def pinned_file(path: str) -> bytes | None:
    """A package file's bytes at the pin (a script another interpreter runs); None unpinned."""
    return _BY_FILE.get(os.path.abspath(path))


def _moved(file: str) -> bool:
    """Whether the file is no longer the one read at the pin (dpkg renames a new one in)."""
    try:
        st = os.stat(file)
    except OSError:
        return True
    return (st.st_ino, st.st_size, st.st_mtime_ns) != _STATS.get(file)


def pinned_copy(path: str, folder: str) -> str | None:
    """The pinned bytes of package file `path` written to `folder` under its name, for a script
    another interpreter runs (the standby's, the incident hook); its path, or None when nothing
    is pinned or it cannot be written (the caller then runs the package's own file)."""
    data = pinned_file(path)
    if data is None:
        return None
    target = os.path.join(folder, os.path.basename(path))
    with contextlib.suppress(OSError), open(target, "rb") as f:
        if f.read() == data:
            return target
    from vllmwatch.config import safefile  # (the daemon has it: no import for the CLI)

    return target if safefile.write_private(target, data.decode("utf-8")) else None


def code_changed() -> str | None:
    """What changed in the package's files since the pin (an upgrade under a running daemon),
    in words with the installed version; None when nothing did (or nothing was pinned)."""
    if not _STATS:
        return None
    moved = [file for file in _STATS if _moved(file)]
    if not moved:
        return None
    _freeze_lines()
    try:
        with open(os.path.join(_HERE, "__init__.py"), "rb") as f:
            found = _VERSION.search(f.read())
    except OSError:
        found = None
    now = found.group(1).decode("ascii", "replace") if found else "unknown"
    return (f"vllmwatch {now} is installed since this daemon started ({__version__}; "
            f"{len(moved)} of {len(_STATS)} files changed)")


# --- signals before the daemon's loop takes them -------------------------------------------
#
# `vllmwatch run` spends its first second (more on a loaded box) importing, loading the config,
# sweeping, starting the gate and the status server before its loop installs its handlers. A
# signal then took its default action: SIGHUP or SIGUSR1 (a reload, `systemctl kill -s
# SIGUSR1`) ended the daemon, and systemd takes a death by SIGHUP for a clean exit (no
# restart); SIGTERM exited -15 without STOPPING=1. They are recorded and handed to the loop,
# which acts on them as on any later one. A stop (SIGTERM, SIGINT) twice before then takes
# its default action after all: a stop insisted on is honoured even if the start never reaches
# the loop. A reload or a restart asked twice is one (the loop would coalesce them too): its
# default action would end the daemon, the very death this hold is for.

# Ctrl-C before cli.main's handling (its imports take a tenth of a second, more on a loaded
# box) ended in Python's traceback of whatever import it met. In the command's own process
# (the console script, python -m vllmwatch) an uncaught KeyboardInterrupt is one line, as
# main says it; Python still exits by SIGINT (130 to the shell), as for any uncaught one.
_HOOK = sys.excepthook


def _interrupted(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    if not issubclass(kind, KeyboardInterrupt):
        _HOOK(kind, value, tb)
        return
    with contextlib.suppress(Exception):  # (stderr closed or full: the exit status says it)
        print("vllmwatch: interrupted", file=sys.stderr)


def _is_command() -> bool:
    argv = getattr(sys, "orig_argv", [])
    by_m = "-m" in argv and argv[argv.index("-m") + 1:][:1] == [__name__]
    return by_m or (bool(sys.argv) and os.path.basename(sys.argv[0]) == __name__)


if _is_command():
    sys.excepthook = _interrupted


_EARLY: list[int] = []
_INSIST = (signal.SIGTERM, signal.SIGINT)


def _record(signum: int, frame: object) -> None:
    if signum in _EARLY and signum in _INSIST:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if signum not in _EARLY:
        _EARLY.append(signum)


def hold_signals(signals: Sequence[int]) -> None:
    """Record these signals until the loop takes them (early_signals)."""
    for signum in signals:
        signal.signal(signum, _record)


def early_signals() -> list[int]:
    """The signals recorded since hold_signals, once (the loop's handlers are in place)."""
    taken = list(_EARLY)
    _EARLY.clear()
    return taken


# The three standard descriptors of a command, made safe before anything opens a file
# (cli.main, first). A descriptor closed by the caller (`vllmwatch status >&-`, `2>&-`, `<&-`)
# is free, and the next file opened takes it: the config, a record, a socket would then sit
# where a child's output or input goes. Python leaves sys.stdout (or stderr, stdin) None for
# it: `print` to it does nothing, `print(file=sys.stderr)` with stderr None writes to stdout
# (print-command's notes above its line to copy), and a flush was an AttributeError's
# traceback.
_STANDARD = ((0, "stdin"), (1, "stdout"), (2, "stderr"))


def take_closed_streams() -> bool:
    """Put /dev/null on each standard descriptor that is closed, with a stream for it;
    whether stdout was closed (the command then refuses: its output would go nowhere)."""
    closed_out = sys.stdout is None
    for fd, name in _STANDARD:
        if getattr(sys, name) is not None:
            continue
        _occupy(fd)
        stream: TextIO = open(os.devnull, "r" if fd == 0 else "w",  # noqa: SIM115
                              encoding="utf-8", errors="backslashreplace")
        setattr(sys, name, stream)
    return closed_out


def _occupy(fd: int) -> None:
    try:
        os.fstat(fd)
        return  # (something of ours took it since the start: left alone)
    except OSError:
        pass
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)
