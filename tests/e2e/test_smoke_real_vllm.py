"""End-to-end: [[smoke]] checks against the real CPU vLLM on the tiny model (issue 38.2).

- `chat` and `messages` (the Anthropic Messages API) pass whatever text the random model
  says; a `tools` check with the tool parser off holds READY with vLLM's own 400, and the
  message names the flags to add (one vLLM start);
- with `--enable-auto-tool-choice --tool-call-parser hermes` vLLM takes the check's tools
  request, and a tool-free answer passes `expect = "any"` (a second start);
- `vllmwatch init` of the guide's whole line, with this vLLM's own flag list, proposes the
  chat check its `--chat-template` calls for, and a tools check once the tool flags are on
  the line (no start).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.e2e_harness import SERVED_NAME, base_url, http, record_times, status
from tests.support import TIMEOUT_SCALE, Daemon, wait_for
from vllmwatch.config.schema import load

pytestmark = pytest.mark.e2e
STARTUP = 300.0 / TIMEOUT_SCALE
GUIDE = Path(__file__).resolve().parent.parent / "shell" / "fixtures" / "guide-qwen35-9b.txt"


def _results(d: Daemon, answered: int) -> dict[str, dict[str, object]]:
    """/status's smoke checks by name, once `answered` have a result."""
    def look() -> dict[str, dict[str, object]] | None:
        checks = {str(c["name"]): c for c in status(d).get("smoke_checks", [])}
        done = [c for c in checks.values() if c["result"] in ("passed", "failed")]
        return checks if len(done) >= answered else None

    return wait_for(look, 30, f"{answered} smoke results in /status", poll=0.5)  # type: ignore[no-any-return]


@pytest.mark.timeout(900)
def test_chat_and_messages_pass_and_tools_without_the_parser_hold_ready(
        start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon({"smoke": [{"endpoint": "chat"}, {"endpoint": "messages"},
                                {"endpoint": "tools"}]})
    failed = d.wait_event("smoke.failed", 2 * STARTUP)
    passed = {e["check"]: e for e in d.named("smoke.passed")}
    assert set(passed) == {"chat", "messages"}, d.dump()
    assert failed["check"] == "tools" and failed["required"] is True
    # vLLM's own words, then what to add to [vllm] args
    assert '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser' \
        in failed["error"], failed
    assert "--enable-auto-tool-choice --tool-call-parser NAME" in failed["error"]
    assert "tool-call-parser" in failed["answer"]
    assert not d.named("child.ready") and d.http_get("/readyz")[0] == 503
    checks = _results(d, 3)
    assert [checks[n]["result"] for n in ("chat", "messages", "tools")] == \
        ["passed", "passed", "failed"]
    # the server itself serves: the hold is about the endpoint, not about liveness
    code, body = http("POST", base_url(d) + "/v1/messages",
                      {"model": SERVED_NAME, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "Hi"}]})
    assert code == 200 and body["type"] == "message", body
    record_times("smoke_real", {check: e["seconds"] for check, e in passed.items()})


@pytest.mark.timeout(900)
def test_tools_with_the_parser_on_pass_a_tool_free_answer(
        start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon({
        "vllm": {"args": {"max-model-len": 2048, "enforce-eager": True, "dtype": "bfloat16",
                          "enable-auto-tool-choice": True, "tool-call-parser": "hermes"}},
        "smoke": [{"endpoint": "tools", "expect": "any"}]})
    d.wait_ready(2 * STARTUP)
    assert [e["check"] for e in d.named("smoke.passed")] == ["tools"], d.dump()
    assert not d.named("smoke.failed")


def _init(text: str, tmp_path: Path, venv: Path, flags: Path) -> Path:
    """`vllmwatch init -- TEXT` (a pasted guide, as one word), with this vLLM's flag list."""
    cache = tmp_path / "cache"
    shutil.copytree(flags, cache / f"vllm-flags-{os.geteuid()}", dirs_exist_ok=True)
    here = tmp_path / f"init-{len(list(tmp_path.glob('init-*')))}"  # its own key file
    here.mkdir()
    config = here / "vllmwatch.toml"
    run = subprocess.run([sys.executable, "-m", "vllmwatch", "init", "-c", str(config),
                          "--", text], capture_output=True, text=True, timeout=600,
                         check=False, env={**os.environ, "CACHE_DIRECTORY": str(cache),
                                           "PATH": f"{venv / 'bin'}:/usr/bin:/bin"})
    assert run.returncode == 0, run.stdout + run.stderr
    return config


def test_init_of_the_guides_line_proposes_the_checks_its_flags_call_for(
        tmp_path: Path, vllm_venv: Path, vllm_flags: Path) -> None:
    text = GUIDE.read_text()
    config = load(str(_init(text, tmp_path, vllm_venv, vllm_flags)))
    assert [c.endpoint for c in config.smoke] == ["chat"]
    with_tools = text.replace("    -O3 \\\n", "    -O3 --enable-auto-tool-choice "
                              "--tool-call-parser hermes \\\n")
    assert with_tools != text
    config = load(str(_init(with_tools, tmp_path, vllm_venv, vllm_flags)))
    assert [c.endpoint for c in config.smoke] == ["tools", "chat"]
