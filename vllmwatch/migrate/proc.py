"""A running vLLM, read from /proc: the argv of the root of its tree (a pid of an EngineCore,
a worker or an APIServer_N shows only a title), its working directory and the environment
that matters to vLLM. Read-only; `proc` is a parameter so that tests can point elsewhere."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from vllmwatch.config.launch import INJECTED_ENV
from vllmwatch.config.redact import REDACT
from vllmwatch.config.serveline import is_vllm_serve

# Variables that change what vLLM does or which devices it sees; the rest of a login
# environment (PATH, TERM, SSH_*, ...) is the shell's, not the deployment's.
MATTERS = ("VLLM_", "HF_", "HUGGING_FACE_", "CUDA_", "NCCL_", "TORCH", "PYTORCH_", "OMP_",
           "MKL_", "TRANSFORMERS_", "TOKENIZERS_", "TRITON_", "NVIDIA_", "HIP_", "ROCR_",
           "LD_PRELOAD", "KMP_", "UCX_", "GLOO_", "RAY_")
_NOT_OURS_TO_COPY = ("VLLMWATCH_",)


class ProcError(ValueError):
    """The pid is not a vLLM we can read; the message says what to do."""


@dataclass(frozen=True)
class Running:
    """What init needs of a running vLLM."""

    pid: int
    argv: list[str]
    cwd: str | None
    env: dict[str, str] = field(default_factory=dict)
    path: str = ""  # its PATH, to find a program named without a directory
    supervised: bool = False  # already the child of a vllmwatch (its marker is set)
    notes: list[str] = field(default_factory=list)
    injected: dict[str, str] = field(default_factory=dict)  # what its vllmwatch set (not kept)


def argv_of(pid: int, proc: str = "/proc") -> list[str] | None:
    """The argv of a process; None when it is gone or hidden."""
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return [w.decode("utf-8", "surrogateescape") for w in raw.rstrip(b"\0").split(b"\0")] if raw \
        else []


def parent_of(pid: int, proc: str = "/proc") -> int | None:
    """The parent pid, from /proc/PID/stat (the name may hold spaces and parentheses)."""
    try:
        with open(f"{proc}/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            stat = fh.read()
        return int(stat.rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def environ_of(pid: int, proc: str = "/proc") -> dict[str, str] | None:
    """The environment a process started with; None when we may not read it."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        name, eq, value = item.decode("utf-8", "surrogateescape").partition("=")
        if eq:
            out[name] = value
    return out


def vllm_root(pid: int, proc: str = "/proc") -> tuple[int, list[str]]:
    """The topmost process at or above pid whose argv runs `vllm serve`."""
    best: tuple[int, list[str]] | None = None
    current: int | None = pid
    seen = 0
    if argv_of(pid, proc) is None:
        raise ProcError(f"no process {pid} (or it is hidden from this user: run as root)")
    while current is not None and current > 1 and seen < 64:
        argv = argv_of(current, proc)
        if argv is not None and is_vllm_serve(argv):
            best = (current, argv)
        current, seen = parent_of(current, proc), seen + 1
    if best is None:
        shown = REDACT.head(" ".join(argv_of(pid, proc) or []), 80)
        raise ProcError(f"pid {pid} ({shown!r}) is not a vLLM server and none of its parents "
                        "is; give the pid of `vllm serve` (pgrep -af 'vllm serve')")
    return best


def read(pid: int, proc: str = "/proc", marker: str = "VLLMWATCH_INSTANCE") -> Running:
    """The running vLLM that pid belongs to."""
    root, argv = vllm_root(pid, proc)
    notes = [f"pid {pid} belongs to the vLLM started as pid {root}"] if root != pid else []
    try:
        cwd: str | None = os.readlink(f"{proc}/{root}/cwd")
    except OSError:
        cwd = None
        notes.append(f"cannot read the working directory of pid {root}: relative paths "
                     "are kept as they were")
    env = environ_of(root, proc)
    if env is None:
        notes.append(f"cannot read the environment of pid {root} (run as root or as its "
                     "owner): CUDA_VISIBLE_DEVICES, VLLM_* and HF_* are not carried over")
        env = {}
    supervised = marker in env
    kept = {k: v for k, v in env.items()
            if k.startswith(MATTERS) and not k.startswith(_NOT_OURS_TO_COPY)}
    ours = sorted(k for k in kept if k in INJECTED_ENV)
    injected = {k: kept[k] for k in ours} if supervised else {}  # (a prewarm switch: envwords)
    if supervised and ours:
        # A supervising vllmwatch set these (its cache directory, its fork choice): the new
        # config's vllmwatch sets them again; copied, they would pin the old values.
        kept = {k: v for k, v in kept.items() if k not in INJECTED_ENV}
        notes.append(f"not copied, vllmwatch sets them itself: {', '.join(ours)} (a value "
                     "you had in the old config's [vllm.env] is in that file)")
    return Running(root, argv, cwd, kept, env.get("PATH", ""), supervised, notes, injected)


def which(word: str, path: str, cwd: str | None) -> str | None:
    """Where the process found a program: its PATH, or its cwd for ./prog."""
    if "/" in word:
        full = os.path.normpath(os.path.join(cwd or "/", word))
        return full if os.access(full, os.X_OK) else None
    for directory in path.split(":"):
        full = os.path.join(directory or cwd or ".", word)
        if directory and os.path.isfile(full) and os.access(full, os.X_OK):
            return full
    return None


def script_form(command: list[str], cwd: str | None, path: str) -> list[str]:
    """`[python, /venv/bin/vllm, serve]` (the kernel's view of a console script) as the person
    typed it, `[/venv/bin/vllm, serve]`, when the script's shebang names that interpreter:
    the same program, in the form systemd, the standby and `ps` all read as `vllm serve`.
    The paths are compared as written, not resolved: a venv's python is a link to the
    system's, yet another interpreter (its own site-packages)."""
    if len(command) < 2 or not os.path.basename(command[0]).startswith("python") \
            or command[1].startswith("-"):
        return command
    script = os.path.normpath(os.path.join(cwd or "/", command[1]))
    try:
        with open(script, "rb") as fh:
            head = fh.read(512).split(b"\n", 1)[0]
    except OSError:
        return command
    words = head[2:].decode("utf-8", "replace").split() if head.startswith(b"#!") else []
    if len(words) == 2 and os.path.basename(words[0]) == "env":
        words = [w for w in [which(words[1], path, cwd)] if w]
    python = command[0] if "/" in command[0] else which(command[0], path, cwd)
    if len(words) != 1 or python is None or not os.access(script, os.X_OK) or \
            os.path.normpath(words[0]) != os.path.normpath(os.path.join(cwd or "/", python)):
        return command
    return [script, *command[2:]]
