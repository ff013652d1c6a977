"""The standby interpreter: vLLM's serve path imported ahead of the next launch.

Run BY FILE PATH under the interpreter of `vllm.command` (vLLM's venv, which does not have
vllmwatch installed): stdlib only, no vllmwatch import. Lifecycle:

1. die with vllmwatch (PR_SET_PDEATHSIG, SIGKILL; gone already -> exit), title itself
   VLLMWATCH::standby, report ``importing`` on the status pipe;
2. import the modules of the spec (argv[1], JSON), never touching a GPU, then report
   ``waiting`` with what was imported, what failed and whether CUDA got initialized;
3. answer each ping on stdin (``{"ping": N}``) with ``alive`` on the status pipe, from the
   reader thread, so even while importing; read the handover (one JSON line: argv, env,
   cwd, wait_s), take its environment and directory, and run the entry as ``__main__``.

Where the pre-imported state cannot be trusted (CUDA initialized, a handover that came
while the imports still ran for longer than wait_s, a file of an imported module changed on
disk since the imports: `pip install -U` of any package, a `git pull` under an editable
install) it execs the launch's argv instead: the
same pid and pipes, a fresh interpreter. EOF on stdin without a handover: exit 0.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # this file's folder (vllmwatch/shell) would shadow `platform`
    del sys.path[0]

import ast
import contextlib
import ctypes
import importlib
import json
import os
import runpy
import signal
import threading
import time
import warnings
from typing import Any

TITLE = "VLLMWATCH::standby"
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def _prctl(option: int, value: int | bytes) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def set_title(title: str, comm: str) -> None:
    """The process title: setproctitle where vLLM's venv has it (vLLM depends on it); and
    /proc/PID/comm (15 characters), which is all there is without it."""
    _prctl(_PR_SET_NAME, comm.encode()[:15])
    try:
        import setproctitle  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return
    setproctitle.setproctitle(title)


def script_imports(path: str) -> list[str]:
    """The top-level modules a console script imports (`from vllm.entrypoints.cli.main
    import main` -> vllm.entrypoints.cli.main): what its entry will need first."""
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    out: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
    return out


def architecture_modules(model: str) -> list[str]:
    """vLLM's module for the model's architecture (a local checkpoint's config.json)."""
    try:
        with open(os.path.join(model, "config.json"), encoding="utf-8") as fh:
            archs = json.load(fh).get("architectures") or []
        registry = importlib.import_module("vllm.model_executor.models.registry")
    except Exception:  # not a local model, or a vLLM without that registry: skip it
        return []
    table = getattr(registry, "_VLLM_MODELS", {})
    if not isinstance(archs, list):  # a config.json of the wrong kind: vLLM says so itself
        return []
    return [f"vllm.model_executor.models.{table[a][0]}" for a in archs
            if isinstance(a, str) and a in table]


def cuda_initialized() -> bool:
    """True when an import initialized CUDA here: torch's own flag (never imports torch), or
    the driver itself (driver_initialized): either way a forked EngineCore could not use it."""
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            if torch.cuda.is_initialized():
                return True
    return driver_initialized()


def driver_initialized(soname: str = "libcuda.so.1") -> bool:
    """True when something in this process called cuInit: torch's flag misses a library
    that asks the driver directly (a cudaGetDeviceCount at import), and after that no child
    forked from here can use CUDA. Looks only at a libcuda already loaded (RTLD_NOLOAD: never
    loads it), whose cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED (3) before cuInit
    and initializes nothing itself."""
    try:
        lib = ctypes.CDLL(soname, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return False  # not loaded: nothing can have initialized it
    count = ctypes.c_int(0)
    try:
        return int(lib.cuDeviceGetCount(ctypes.byref(count))) == 0
    except (AttributeError, OSError):
        return False


class Standby:
    """One standby: imports on the main thread, the handover read on a second thread."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.imported = threading.Event()
        self.message: dict[str, Any] | None = None
        self.arrived = threading.Event()
        self.status_fd = int(spec.get("status_fd", -1))
        self.stamps: dict[str, tuple[int, int, int]] = {}

    def report(self, event: str, **fields: Any) -> None:
        """One JSON line to vllmwatch; a gone reader is not our problem."""
        if self.status_fd < 0:
            return
        line = json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n"
        with contextlib.suppress(OSError):
            os.write(self.status_fd, line.encode())

    def import_all(self) -> None:
        """Import the spec's modules in order; a failure is reported, never fatal."""
        started = time.monotonic()
        entry = self.spec.get("entry", {})
        names = [*script_imports(entry["target"])] if entry.get("kind") == "path" else []
        names += list(self.spec.get("modules", []))
        imported: list[str] = []
        failed: dict[str, str] = {}
        for name in _unique(names):
            self._import(name, imported, failed)
        for name in architecture_modules(str(self.spec.get("model", ""))):
            self._import(name, imported, failed)
        self.stamps = module_stamps()
        self.report("waiting", imported=imported, failed=failed,
                    seconds=round(time.monotonic() - started, 3), cuda=cuda_initialized(),
                    vllm=_vllm_stamp())
        self.imported.set()

    @staticmethod
    def _import(name: str, imported: list[str], failed: dict[str, str]) -> None:
        if name in imported or name in failed:
            return
        try:
            importlib.import_module(name)
        except BaseException as exc:  # SystemExit from an import too: the standby lives on
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
            return
        imported.append(name)

    def read_handover(self) -> None:
        """The reader thread: pings (each answered on the status pipe: vllmwatch's proof
        that we are alive before it hands us a launch), then the handover line; EOF means
        we were discarded."""
        while True:
            line = sys.stdin.buffer.readline()
            if not line:
                os._exit(0)
            try:
                msg = json.loads(line)
            except ValueError:
                os._exit(3)
            if isinstance(msg, dict) and "ping" in msg and "argv" not in msg:
                self.report("alive", ping=msg["ping"])
                continue
            self.message = msg
            break
        self.arrived.set()
        wait_s = float(self.message.get("wait_s", 0.0)) if self.message else 0.0
        if not self.imported.wait(max(0.0, wait_s)):
            # Still importing after the bounded wait: start over fresh (same pid and pipes).
            self.exec_fresh("imports still running at the handover")

    def exec_fresh(self, why: str) -> None:
        """Replace this process by the launch's own command line."""
        msg = self.message or {}
        print(f"vllmwatch standby: {why}; starting {msg['argv'][0]} fresh", file=sys.stderr,
              flush=True)
        _prctl(_PR_SET_PDEATHSIG, 0)
        env = {str(k): str(v) for k, v in msg["env"].items()}
        with contextlib.suppress(OSError):
            os.chdir(msg.get("cwd") or "/")
        try:
            os.execvpe(msg["argv"][0], list(msg["argv"]), env)
        except OSError as exc:
            print(f"vllmwatch standby: cannot run {msg['argv'][0]}: {exc}", file=sys.stderr,
                  flush=True)
            os._exit(127)

    def become(self) -> None:
        """Take the launch's environment and directory and run its entry as __main__."""
        msg = self.message
        assert msg is not None
        if cuda_initialized():
            self.exec_fresh("CUDA was initialized by the imports")
        moved = changed_files(self.stamps)
        if moved:  # old code in memory would run against the new files on disk
            self.exec_fresh(f"{len(moved)} imported module file(s) changed on disk since the "
                            f"imports (a package reinstalled?), e.g. {moved[0]}")
        _prctl(_PR_SET_PDEATHSIG, 0)  # the child contract from here on: as a Popen child
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in msg["env"].items()})
        os.chdir(msg.get("cwd") or "/")
        tempfile: Any = sys.modules.get("tempfile")
        if tempfile is not None:
            tempfile.tempdir = None  # cached from the standby's TMPDIR; read the launch's
        with contextlib.suppress(OSError):  # stdin as a Popen child has it: /dev/null
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
        if self.status_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.status_fd)
        argv = [str(a) for a in msg["argv"]]
        entry = self.spec["entry"]
        # sys.path[0] as a plain launch has it: the script's folder, or the directory for -m.
        sys.path.insert(0, os.path.dirname(entry["target"]) if entry["kind"] == "path"
                        else os.getcwd())
        set_title(" ".join(argv), os.path.basename(argv[0]))  # as an exec would name it
        run_entry(entry, argv)


def run_entry(entry: dict[str, Any], argv: list[str]) -> None:
    """Run the console script (or `python -m module`) as __main__: its guard holds, and a
    spawned EngineCore re-imports it as __mp_main__ as it would after a plain launch."""
    skip = int(entry.get("skip", 1))
    if entry["kind"] == "module":
        sys.argv = [entry["target"], *argv[skip:]]
        with warnings.catch_warnings():  # it was imported ahead on purpose
            warnings.filterwarnings("ignore", category=RuntimeWarning, module="runpy")
            runpy.run_module(entry["target"], run_name="__main__", alter_sys=True)
        return
    sys.argv = [entry["target"], *argv[skip:]]
    runpy.run_path(entry["target"], run_name="__main__")


def module_stamps() -> dict[str, tuple[int, int, int]]:
    """Every imported module's file now, (mtime_ns, inode, size): vllmwatch stamps only
    vLLM's __init__.py, which an upgrade of another package (transformers, torch) or an edited
    source file under an editable install leaves as it was. Not this script (__main__: its
    pinned copy goes with the standby's TMPDIR at the handover) nor anything under that
    TMPDIR; a module without a file of its own (built-in, zipimport) has no stamp."""
    tmp = os.environ.get("TMPDIR") or "/nonexistent"
    own = (tmp.rstrip(os.sep) + os.sep, os.path.realpath(tmp) + os.sep)
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    out: dict[str, tuple[int, int, int]] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or path in out or path == main \
                or path.startswith(own):
            continue
        with contextlib.suppress(OSError):
            st = os.stat(path)
            out[path] = (st.st_mtime_ns, st.st_ino, st.st_size)
    return out


def changed_files(stamps: dict[str, tuple[int, int, int]]) -> list[str]:
    """The stamped files changed or gone since (a few ms for vLLM's ~5000 modules)."""
    out = []
    for path, stamp in stamps.items():
        try:
            st = os.stat(path)
        except OSError:
            out.append(path)
            continue
        if (st.st_mtime_ns, st.st_ino, st.st_size) != stamp:
            out.append(path)
    return out


def _unique(names: list[str]) -> list[str]:
    return list(dict.fromkeys(n for n in names if n))


def _vllm_stamp() -> dict[str, Any]:
    """Which vLLM was imported: its version and package file, so a reinstall shows."""
    vllm = sys.modules.get("vllm")
    path = getattr(vllm, "__file__", None) if vllm is not None else None
    if not path:
        return {}
    try:
        st = os.stat(path)
    except OSError:
        return {}
    return {"version": str(getattr(vllm, "__version__", "")), "file": path,
            "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def main() -> None:
    """Run one standby (see the module docstring)."""
    spec = json.loads(sys.argv[1])
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != int(spec.get("parent", os.getppid())):
        os._exit(0)  # vllmwatch died before the death signal was armed
    if int(spec.get("status_fd", -1)) >= 0:
        os.set_inheritable(int(spec["status_fd"]), False)  # never into vLLM's children
    set_title(TITLE, TITLE)
    standby = Standby(spec)
    standby.report("importing")
    threading.Thread(target=standby.read_handover, name="handover", daemon=True).start()
    standby.import_all()
    standby.arrived.wait()
    standby.become()


if __name__ == "__main__":
    main()
