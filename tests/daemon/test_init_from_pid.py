"""`vllmwatch init --from-pid` against a running fake vLLM started with a known argv and
environment: the pid of its EngineCore leads to the API server's argv, the interpreter and
working directory come along, the environment that matters is kept, secrets never written."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support import free_port, wait_for
from vllmwatch.migrate import proc, runner

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

API_KEY = "sk-running-0123456789"
HF_TOKEN = "hf_runningtoken987"


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, int]]:
    """`vllm serve ./models/tiny ...` as a console script of this Python, started in
    tmp_path/work with CUDA_VISIBLE_DEVICES, VLLM_*, HF_* and secrets in its environment."""
    yield from _run(tmp_path, {}, [])


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, int]]:
    """The same, as a vllmwatch launches it: its marker, what it injects, and the user's own."""
    yield from _run(tmp_path, {"VLLMWATCH_INSTANCE": "abc123", "VLLM_CACHE_ROOT": "/old/vllm",
                               "TRITON_CACHE_DIR": "/old/triton", "HF_HOME": "/old/hf",
                               "VLLM_WORKER_MULTIPROC_METHOD": "fork",
                               "VLLM_ENABLE_STARTUP_PLAN": "1", "TMPDIR": "/tmp/vllmwatch-x",
                               "VLLM_USE_MEGA_AOT_ARTIFACT": "0"},
                    ["--shutdown-timeout", "120"])


def _run(tmp_path: Path, more_env: dict[str, str], more_argv: list[str]
         ) -> Iterator[tuple[subprocess.Popen[bytes], Path, int]]:
    bin_dir, work = tmp_path / "venv" / "bin", tmp_path / "work"
    bin_dir.mkdir(parents=True)
    (work / "models" / "tiny").mkdir(parents=True)
    script = bin_dir / "vllm"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom vllmwatch.testing.fake_vllm "
                      "import main\nsys.exit(main(sys.argv[1:]))\n")
    script.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "MIG-4f1c2a",
           "VLLM_LOGGING_LEVEL": "DEBUG", "HF_HOME": str(tmp_path / "hf"),
           "HF_TOKEN": HF_TOKEN, "TERM": "xterm", "SSH_CONNECTION": "10.0.0.1 22",
           "PYTHONPATH": os.pathsep.join(sys.path), **more_env}
    port = free_port()
    argv = ["vllm", "serve", "./models/tiny", "--port", str(port), "--served-model-name", "tiny",
            "--api-key", API_KEY, "--max-num-seqs", "4", "--enforce-eager", *more_argv]
    child = subprocess.Popen(argv, cwd=work, env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield child, work, port
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def engine_of(pid: int) -> int:
    for p in psutil.Process(pid).children(recursive=True):
        if "VLLM::EngineCore" in " ".join(p.cmdline()):
            return p.pid
    return 0


def test_from_the_engine_pid_to_a_config(
        running: tuple[subprocess.Popen[bytes], Path, int], tmp_path: Path) -> None:
    child, work, port = running
    engine = wait_for(lambda: engine_of(child.pid), 30, "the fake vLLM's EngineCore")
    assert proc.vllm_root(engine)[0] == child.pid
    out, err = io.StringIO(), io.StringIO()
    req = runner.Request([], engine, str(tmp_path / "etc" / "vllmwatch.toml"), stdout=True,
                         fast=True)
    assert runner.main(req, os.environ, out=out, err=err) == 0, err.getvalue()
    text = out.getvalue()
    assert API_KEY not in text + err.getvalue() and HF_TOKEN not in text + err.getvalue()
    vllm = tomllib.loads(text)["vllm"]
    # The kernel shows [python, .../bin/vllm, serve]; written as the script itself, the form
    # systemd and the standby run (issue 36.3).
    assert vllm["command"] == [str(tmp_path / "venv" / "bin" / "vllm"), "serve"]
    from vllmwatch.shell.standby import Entry, resolve

    assert isinstance(resolve(vllm["command"], None), Entry)
    assert vllm["model"] == str(work / "models" / "tiny")  # was relative to its cwd
    assert vllm["served_model_name"] == "tiny" and vllm["port"] == port
    assert vllm["api_key_file"] == str(tmp_path / "etc" / "api-key")
    assert vllm["env"] == {"CUDA_VISIBLE_DEVICES": "MIG-4f1c2a",
                           "HF_HOME": str(tmp_path / "hf"), "VLLM_LOGGING_LEVEL": "DEBUG"}
    assert vllm["args"] == {"max-num-seqs": 4, "enforce-eager": True}
    assert f"belongs to the vLLM started as pid {child.pid}" in err.getvalue()
    assert "sudoedit" in err.getvalue() and "HF_TOKEN" in err.getvalue()


def test_what_a_supervising_vllmwatch_injected_is_not_copied(
        supervised: tuple[subprocess.Popen[bytes], Path, int], tmp_path: Path) -> None:
    child, _, _ = supervised
    wait_for(lambda: engine_of(child.pid), 30, "the fake vLLM's EngineCore")
    out, err = io.StringIO(), io.StringIO()
    req = runner.Request([], child.pid, str(tmp_path / "etc" / "vllmwatch.toml"), stdout=True,
                         fast=True)
    assert runner.main(req, os.environ, out=out, err=err) == 0, err.getvalue()
    data = tomllib.loads(out.getvalue())
    vllm = data["vllm"]
    # What vllmwatch adds (config/launch.py INJECTED_*) stays out; the rest is the user's.
    assert vllm["env"] == {"CUDA_VISIBLE_DEVICES": "MIG-4f1c2a", "VLLM_LOGGING_LEVEL": "DEBUG"}
    assert "shutdown-timeout" not in vllm["args"]
    assert vllm["args"] == {"max-num-seqs": 4, "enforce-eager": True}
    assert "already supervised by a vllmwatch" in err.getvalue()
    assert "VLLM_CACHE_ROOT" in err.getvalue()  # said, not silently dropped
    # ... but what it set from the old config's keys is those keys again: the new config
    # drains and compiles as the old one did (dropped, its defaults drained 30 s and let
    # vLLM turn the mega AOT artifact on)
    assert data["restart"] == {"drain_timeout": 120}
    assert data["prewarm"] == {"mega_aot_artifact": False}


def test_a_pid_that_is_not_vllm_is_refused(tmp_path: Path) -> None:
    err = io.StringIO()
    req = runner.Request([], os.getpid(), str(tmp_path / "x.toml"), stdout=True, fast=True)
    assert runner.main(req, os.environ, out=io.StringIO(), err=err) == 2
    assert "is not a vLLM server" in err.getvalue()
