"""The standby process itself (shell/standby_main.py): imports, handover, fresh exec, death.

Each test starts a real standby under this interpreter with a tiny entry script and owns it:
the fixture kills its session at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support import TIMEOUT_SCALE, sigstop, wait_for
from tests.support.procs import environ
from vllmwatch.config.command import ChildCommand
from vllmwatch.shell import standby as sb
from vllmwatch.shell.child import MARKER
from vllmwatch.shell.standby import Entry, resolve

PYTHON = sys.executable
ENTRY = """\
#!{python}
import os, sys, json
import {module}
if __name__ == "__main__":
    out = {{"pid": os.getpid(), "argv": sys.argv[1:], "cwd": os.getcwd(),
           "x": os.environ.get("X"), "tmpdir": os.environ.get("TMPDIR"),
           "preimported": "{module}" in sys.modules, "name": __name__}}
    with open(os.environ["OUT"], "w") as fh:
        json.dump(out, fh)
"""


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, object]]:
    """An entry script importing module `slowmod` (which waits for a file), and cleanup."""
    lib = tmp_path / "lib"
    lib.mkdir()
    # Its bound only ends a leftover: it must outlast every wait of a test that wants the
    # import still running (a loaded box stretches those by TIMEOUT_SCALE), so it scales too.
    (lib / "slowmod.py").write_text(textwrap.dedent(f"""\
        import os, time
        deadline = time.monotonic() + {60 * TIMEOUT_SCALE}
        while not os.path.exists({str(tmp_path / "go")!r}) and time.monotonic() < deadline:
            time.sleep(0.02)  # a slow import: it polls the test's go-file, bounded
        """))
    script = tmp_path / "fakeserve"
    script.write_text(ENTRY.format(python=PYTHON, module="slowmod"))
    script.chmod(0o755)
    made: list[sb.Standby] = []
    yield {"tmp": tmp_path, "lib": lib, "script": script, "made": made}
    for standby in made:
        standby.kill()


def _start(world: dict[str, object], env_extra: dict[str, str] | None = None,
           modules: tuple[str, ...] = ()) -> tuple[sb.Standby, ChildCommand]:
    tmp, lib, script = Path(str(world["tmp"])), world["lib"], str(world["script"])
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{lib}", "X": "standby",
           **(env_extra or {})}
    cmd = ChildCommand(argv=(script, "--flag", "1"), env=env)
    entry = resolve(cmd.argv, env["PATH"])
    assert isinstance(entry, Entry)
    standby = sb.start(entry, cmd, (), modules, "", "m" * 16)
    made = world["made"]
    assert isinstance(made, list)
    made.append(standby)
    launch = ChildCommand(argv=cmd.argv, env={**env, "X": "launch", "TMPDIR": str(tmp),
                                              "OUT": str(tmp / "out.json")})
    return standby, launch


def _waiting(standby: sb.Standby) -> bool:
    standby.poll()
    return standby.state == "waiting"


def test_handover_runs_the_entry_as_main_with_the_launchs_env_and_cwd(
        world: dict[str, object]) -> None:
    tmp = Path(str(world["tmp"]))
    (tmp / "go").touch()
    standby, launch = _start(world)
    wait_for(lambda: _waiting(standby), 30, "the standby to report waiting")
    assert "slowmod" in standby.report["imported"] and standby.report["cuda"] is False
    assert psutil.Process(standby.pid).name().startswith("VLLMWATCH::")
    assert os.getpgid(standby.pid) == standby.pid  # its own session: pid = group after all
    (tmp / "cwd").mkdir()
    child = standby.hand_over(launch, str(tmp / "cwd"), "m" * 16)
    assert child.proc.wait(30 * TIMEOUT_SCALE) == 0
    out = __import__("json").loads((tmp / "out.json").read_text())
    assert out == {"pid": standby.pid, "argv": ["--flag", "1"], "cwd": str(tmp / "cwd"),
                   "x": "launch", "tmpdir": str(tmp), "preimported": True, "name": "__main__"}


def test_it_proves_it_is_alive_on_its_pipe_and_a_stopped_one_cannot(
        world: dict[str, object]) -> None:
    """Issue 37.7: the launcher hands a launch only to a standby that answers a ping on its
    status pipe within the bound: while it imports (the reader thread answers) and after;
    never while it is stopped; and a late answer to an old ping proves nothing new."""
    tmp = Path(str(world["tmp"]))
    standby, launch = _start(world)
    # What is told apart is alive from stopped, not a speed: a live standby's answer waits
    # the launcher's bound scaled (TIMEOUT_SCALE), since the first comes from an interpreter
    # just started, which a loaded box can keep past 2 s. The stopped one never answers.
    proof = sb.PROOF_WAIT * TIMEOUT_SCALE
    assert standby.answers(proof)  # still importing slowmod: the reader answers
    (tmp / "go").touch()
    wait_for(lambda: _waiting(standby), 30, "the standby to report waiting")
    assert standby.answers(proof)
    sigstop(standby.pid)
    try:
        assert not standby.answers(0.3)
    finally:
        os.kill(standby.pid, signal.SIGCONT)
    assert standby.answers(proof)  # alive again: the newest ping is answered
    child = standby.hand_over(launch, str(tmp), "m" * 16)  # the pings left it usable
    assert child.proc.wait(30 * TIMEOUT_SCALE) == 0


def test_a_handover_while_still_importing_waits_then_starts_fresh(
        world: dict[str, object]) -> None:
    standby, launch = _start(world)
    old = sb.HANDOVER_WAIT
    sb.HANDOVER_WAIT = 0.3  # the bounded wait; then the standby execs the plain command
    try:
        child = standby.hand_over(launch, str(world["tmp"]), "m" * 16)
    finally:
        sb.HANDOVER_WAIT = old
    tmp = Path(str(world["tmp"]))
    out_path = tmp / "out.json"
    # The fresh interpreter imports slowmod again and waits for the file: let it through.
    wait_for(lambda: psutil.Process(standby.pid).name() == "fakeserve", 30,
               "the exec of the plain command")
    (tmp / "go").touch()
    assert child.proc.wait(30 * TIMEOUT_SCALE) == 0
    out = __import__("json").loads(out_path.read_text())
    assert out["pid"] == standby.pid and out["x"] == "launch" and out["name"] == "__main__"
    output = child.stdout.read().decode()
    assert "imports still running at the handover" in output


def test_cuda_initialized_is_reported_and_the_handover_starts_fresh(
        world: dict[str, object]) -> None:
    tmp = Path(str(world["tmp"]))
    (tmp / "go").touch()
    fake = Path(str(world["lib"])) / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("class cuda:\n    is_initialized = staticmethod("
                                      "lambda: True)\n")
    standby, launch = _start(world, modules=("torch",))
    wait_for(lambda: _waiting(standby), 30, "the standby to report waiting")
    assert standby.poll() == "CUDA was initialized by its imports"
    child = standby.hand_over(launch, str(tmp), "m" * 16)  # defence in depth: it refuses
    assert child.proc.wait(30 * TIMEOUT_SCALE) == 0
    assert "CUDA was initialized" in child.stdout.read().decode()


# A stand-in for the NVIDIA driver with its contract for this check: cuDeviceGetCount answers
# CUDA_ERROR_NOT_INITIALIZED (3) until cuInit was called.
FAKE_LIBCUDA = """\
static int inited;
int cuInit(unsigned int flags) { (void)flags; inited = 1; return 0; }
int cuDeviceGetCount(int *n) { if (!inited) return 3; *n = 1; return 0; }
"""


@pytest.mark.parametrize("calls_cuinit", [False, True])
def test_a_driver_initialized_by_an_import_is_reported_though_torch_says_no(
        world: dict[str, object], calls_cuinit: bool) -> None:
    """A library that calls the driver at import (cuInit, as cudaGetDeviceCount does) leaves
    torch's flag False but breaks CUDA in a forked EngineCore: the standby says so. One that
    only loads libcuda.so.1 is fine (vLLM's API server does as much)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler here to build a stand-in libcuda.so.1")
    tmp, lib = Path(str(world["tmp"])), Path(str(world["lib"]))
    (tmp / "go").touch()
    (tmp / "cuda.c").write_text(FAKE_LIBCUDA)
    so = tmp / "libcuda.so.1"
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(so),
                    str(tmp / "cuda.c")], check=True, timeout=120 * TIMEOUT_SCALE)
    (lib / "torch").mkdir()  # torch's own flag: never initialized
    (lib / "torch" / "__init__.py").write_text(
        "class cuda:\n    is_initialized = staticmethod(lambda: False)\n")
    (lib / "drvlib.py").write_text(f"import ctypes\n_d = ctypes.CDLL({str(so)!r})\n"
                                   + ("_d.cuInit(0)\n" if calls_cuinit else ""))
    standby, _ = _start(world, modules=("torch", "drvlib"))
    wait_for(lambda: _waiting(standby), 30, "the standby to report waiting")
    assert "drvlib" in standby.report["imported"]
    assert standby.report["cuda"] is calls_cuinit
    assert standby.poll() == ("CUDA was initialized by its imports" if calls_cuinit else None)


def test_an_eof_without_handover_ends_it(world: dict[str, object]) -> None:
    (Path(str(world["tmp"])) / "go").touch()
    standby, _ = _start(world)
    wait_for(lambda: _waiting(standby), 30, "the standby to report waiting")
    assert standby.proc.stdin is not None
    standby.proc.stdin.close()
    assert standby.proc.wait(10 * TIMEOUT_SCALE) == 0


def test_it_dies_with_its_parent(tmp_path: Path, world: dict[str, object]) -> None:
    """PR_SET_PDEATHSIG: a parent killed by SIGKILL takes the standby with it."""
    (tmp_path / "go").touch()
    parent = textwrap.dedent(f"""\
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from vllmwatch.config.command import ChildCommand
        from vllmwatch.shell import standby as sb
        from vllmwatch.shell.standby import resolve
        cmd = ChildCommand(argv=({str(world['script'])!r},),
                           env={{"PATH": "/usr/bin:/bin", "PYTHONPATH": {str(world['lib'])!r}}})
        s = sb.start(resolve(cmd.argv, "/usr/bin"), cmd, (), (), "", "p" * 16)
        print(s.pid, flush=True)
        time.sleep(120)  # a lifetime, not a wait: its owner kills it
        """)
    proc = subprocess.Popen([PYTHON, "-c", parent], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        assert psutil.pid_exists(pid)
        proc.kill()
        proc.wait(10 * TIMEOUT_SCALE)
        wait_for(lambda: not _alive(pid), 10, "the standby to die with its parent")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(NameError, ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # only if the death signal failed


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_marker_and_tmpdir_of_a_standby(world: dict[str, object]) -> None:
    (Path(str(world["tmp"])) / "go").touch()
    standby, _ = _start(world)
    env = environ(standby.pid)  # (read too soon, a just-started process's is empty)
    assert env[MARKER] == "m" * 16
    assert os.path.basename(env["TMPDIR"]).startswith("vllmwatch-standby-")  # not a run's
    standby.kill()
    assert not os.path.exists(env["TMPDIR"])
