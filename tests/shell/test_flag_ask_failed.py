"""A failed ask of vLLM's flags is remembered per vLLM version and interpreter: the daemon's
launches do not ask again for vllmflags.RETRY_FAILED_S, and say why [vllm.args] is unchecked.
Before, every launch started a background ask (an import of torch, up to 120 s, beside the
vLLM being started) that failed the same way, at every restart. `check` asks anyway, and an
answer forgets the failure."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from vllmwatch.config import vllmflags
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.shell import versions
from vllmwatch.testing.waiting import TIMEOUT_SCALE, wait_for


def _setup(tmp_path: Path) -> tuple[Config, dict[str, str], str]:
    # this interpreter has no vLLM: the probe answers nothing (exit 0, no line)
    config = from_dict({"vllm": {"model": "/m", "command": [sys.executable]},
                        "prewarm": {"cache_dir": str(tmp_path)}})
    env = {"CACHE_DIRECTORY": "", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    return config, env, vllmflags.default_cache_dir(config, env)


def _launches(config: Config, env: dict[str, str], n: int
              ) -> list[tuple[str, str, dict[str, Any]]]:
    logged: list[tuple[str, str, dict[str, Any]]] = []
    lock = threading.Lock()

    def log(level: str, event: str, **fields: Any) -> None:
        with lock:
            logged.append((level, event, fields))

    def asked_done() -> bool:
        with versions._lock:
            return not versions._asking

    for _ in range(n):
        assert versions.refusal(config, env, "0.99.0", log) is None
        wait_for(asked_done, 60, "the background ask of vLLM's flags to end")
    with lock:
        return list(logged)


def test_a_failed_ask_is_not_repeated_at_every_launch(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    config, env, cache = _setup(tmp_path)
    asks: list[str] = []
    real = vllmflags._ask
    monkeypatch.setattr(vllmflags, "_ask", lambda *a: asks.append(a[0]) or real(*a))
    logged = _launches(config, env, 3)
    assert len(asks) == 1, logged
    unknown = [f["detail"] for level, e, f in logged if e == "vllm.flags_unknown"]
    assert len(unknown) == 3 and all("no answer (exit 0" in d for d in unknown), logged
    assert "asked again after 60 min" in unknown[-1] and "vllmwatch check" in unknown[-1]
    # `check` (no retry_after) asks anyway
    assert vllmflags.known_flags(config.vllm.command, "0.99.0", cache) is None
    assert len(asks) == 2


def test_after_its_time_and_after_an_answer_vllm_is_asked_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, env, cache = _setup(tmp_path)
    asks: list[str] = []
    real = vllmflags._ask
    monkeypatch.setattr(vllmflags, "_ask", lambda *a: asks.append(a[0]) or real(*a))
    _launches(config, env, 1)
    failed = next(Path(cache).glob("*.failed"))
    record = json.loads(failed.read_text())
    failed.write_text(json.dumps({**record, "at": time.time() - vllmflags.RETRY_FAILED_S - 1}))
    _launches(config, env, 1)
    assert len(asks) == 2
    # an answer forgets the failure
    fixture = Path(__file__).parent / "fixtures" / "vllm-0.32.0-flags.json"
    got = vllmflags._from_probe("0.99.0", json.loads(fixture.read_text()))
    monkeypatch.setattr(vllmflags, "_ask", lambda *a: got)
    assert vllmflags.known_flags(config.vllm.command, "0.99.0", cache) is got
    assert not list(Path(cache).glob("*.failed"))
    assert vllmflags.failed_ask(config.vllm.command, "0.99.0", cache) is None


def test_check_says_why_vllm_could_not_be_asked(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from vllmwatch.check import vllm as check_vllm
    from vllmwatch.check.base import WARN, Context

    config, _env, cache = _setup(tmp_path)
    monkeypatch.setattr(check_vllm.vllminfo, "version", lambda command: "0.99.0")
    r = check_vllm.check_vllm_args(Context(config, flags_cache=cache))
    assert r.status == WARN and "no answer (exit 0: not installed for" in r.detail, r


def test_an_ask_dies_with_the_vllmwatch_that_asked(tmp_path: Path) -> None:
    # The ask imports torch for up to 120 s; a vllmwatch that exits meanwhile (a stop, a
    # crash, `check` interrupted) left it running: the probe now dies with the asking thread
    import os
    import signal
    import subprocess

    env = tmp_path / "venv"  # an interpreter whose `import vllm` hangs, as torch's can
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = next((env / "lib").glob("python*/site-packages"))
    pid_file = tmp_path / "probe.pid"
    (site / "vllm").mkdir()
    (site / "vllm" / "__init__.py").write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(600)  # the import that does not end (a lifetime: it outlasts every wait)\n")
    asker = (  # a vllmwatch that asks in a thread, then exits once the probe runs
        "import sys, threading, time, os\n"
        "from vllmwatch.config import vllmflags\n"
        f"threading.Thread(target=vllmflags.known_flags, args=([{str(env / 'bin' / 'python')!r}],"
        f" '0.99.0', {str(tmp_path / 'cache')!r}), daemon=True).start()\n"
        f"while not os.path.exists({str(pid_file)!r}): time.sleep(0.02)\n")
    parent = subprocess.Popen([sys.executable, "-c", asker], start_new_session=True,
                              cwd=Path(__file__).resolve().parents[2])
    try:
        assert parent.wait(60 * TIMEOUT_SCALE) == 0  # two fresh interpreters: it scales
        probe = int(wait_for(lambda: pid_file.read_text().strip(), 10, "the probe's pid"))

        def gone() -> bool:
            try:
                os.kill(probe, 0)
            except ProcessLookupError:
                return True
            return Path(f"/proc/{probe}/stat").read_text().split(")")[-1].split()[0] == "Z"

        wait_for(gone, 10, "the probe to die with the vllmwatch that asked")
    finally:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
