"""[[smoke]] with the real daemon over the fake vLLM (issue 38.2): chat, tools and the
Anthropic Messages API checked before READY; a tool parser that is not on fails READY with
vLLM's own 400 and the flags to add; a check failing then passing on the next start; an
optional check reported (log, /status, `vllmwatch status`, metric) without holding READY."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support import TIMEOUT_SCALE, Daemon, base_config, free_port, merge
from tests.support.daemon import RECORD
from vllmwatch.testing.daemon import PYTHON
from vllmwatch.testing.waiting import wait_for

TOOLS = {"enable-auto-tool-choice": True, "tool-call-parser": "hermes"}


def _daemon(tmp_path: Path, smoke: list[dict[str, Any]], args: dict[str, Any] | None = None,
            fake: list[str] | None = None, startup: str = "60s") -> Daemon:
    cfg: dict[str, Any] = merge(base_config(free_port(), free_port(), fake),
                                {"startup": {"timeout": startup}}, RECORD)
    cfg["vllm"]["args"] = args or {}
    cfg["smoke"] = smoke
    return Daemon(tmp_path, cfg).start()


def _checks(d: Daemon, answered: int) -> list[dict[str, Any]]:
    """/status's smoke_checks once `answered` of them have a result (the snapshot is
    published at the end of the loop's turn, after the event that said so)."""
    def look() -> list[dict[str, Any]] | None:
        code, body = d.http_get("/status")
        checks: list[dict[str, Any]] = json.loads(body)["smoke_checks"] if code == 200 else []
        done = [c for c in checks if c["result"] in ("passed", "failed")]
        return checks if len(done) >= answered else None

    return wait_for(look, 10.0, f"{answered} smoke checks answered in /status")  # type: ignore[no-any-return]


def test_chat_tools_and_messages_pass_before_ready(tmp_path: Path) -> None:
    d = _daemon(tmp_path, [{"endpoint": "chat"}, {"endpoint": "tools"},
                           {"endpoint": "messages"}], args=TOOLS)
    try:
        ready = d.wait_ready(30)
        passed = d.named("smoke.passed")
        assert [e["check"] for e in passed] == ["chat", "tools", "messages"]
        assert all(d.index(e) < d.index(ready) for e in passed)  # every check before READY
        canary = d.named("state.changed", to="ready")
        assert canary and not d.named("smoke.failed")
        checks = _checks(d, 3)
        assert [(c["name"], c["result"]) for c in checks] == [
            ("chat", "passed"), ("tools", "passed"), ("messages", "passed")]
        code, _ = d.stop()
        assert code == 0
    finally:
        d.close()


def test_tools_without_the_parser_hold_ready_and_fail_the_start_by_name(
        tmp_path: Path) -> None:
    # A failed required check holds READY until startup.timeout ends the start: long
    # enough that a loaded box's start reaches its check first (6 s did not, on CI's class
    # of box: every start timed out before the check ran)
    d = _daemon(tmp_path, [{"endpoint": "tools"}], startup="25s")
    try:
        failed = d.wait_event("smoke.failed", 60)
        assert failed["check"] == "tools" and failed["required"] is True
        assert "--enable-auto-tool-choice and --tool-call-parser to be set" in failed["error"]
        assert "--enable-auto-tool-choice --tool-call-parser NAME" in failed["error"]
        assert 'tool choice requires --enable-auto-tool-choice' in failed["answer"]
        assert d.http_get("/readyz")[0] == 503 and not d.named("child.ready")
        checks = _checks(d, 1)
        assert checks[0]["result"] == "failed" and checks[0]["required"] is True
        begin = d.wait_event("restart.begin", 60)
        assert begin["reason"] == "start_timeout"
        assert "smoke check 'tools'" in begin["detail"]
        assert "requires --enable-auto-tool-choice" in begin["detail"]
        rec = d.wait_event("incident.recorded", 60)
        record = json.loads((Path(rec["incident_path"]) / "record.json").read_text())
        assert "smoke check 'tools'" in json.dumps(record)
    finally:
        d.close()


def test_a_check_failing_then_passing_on_the_next_start(tmp_path: Path) -> None:
    flag = tmp_path / "messages-broken"
    flag.touch()
    d = _daemon(tmp_path, [{"endpoint": "messages"}],
                fake=["--fake-messages-fail-while", str(flag)], startup="25s")  # (as above)
    try:
        failed = d.wait_event("smoke.failed", 60)
        assert "does not support Messages API" in failed["error"]
        flag.unlink()  # fixed: the next start's check passes (this one's is never re-sent)
        d.wait_event("restart.begin", 60, reason="start_timeout")
        d.wait_ready(90)
        assert len(d.named("smoke.failed")) == 1 and len(d.named("smoke.passed")) == 1
    finally:
        d.close()


def test_an_optional_check_is_reported_and_does_not_hold_ready(tmp_path: Path) -> None:
    d = _daemon(tmp_path, [{"endpoint": "chat"},
                           {"endpoint": "tools", "name": "ide-tools", "required": False}])
    try:
        d.wait_ready(30)
        failed = d.named("smoke.failed")
        assert [(e["check"], e["required"]) for e in failed] == [("ide-tools", False)]
        checks = {c["name"]: c for c in _checks(d, 2)}
        assert checks["ide-tools"]["result"] == "failed" and checks["chat"]["result"] == \
            "passed"
        _, body = d.http_get("/metrics")
        text = body.decode()
        assert 'vllmwatch_smoke_check_passed{check="ide-tools",endpoint="tools",' \
               'required="false"} 0.0' in text
        assert 'vllmwatch_smoke_check_passed{check="chat",endpoint="chat",' \
               'required="true"} 1.0' in text
        shown = subprocess.run([PYTHON, "-m", "vllmwatch", "status", "--config",
                                str(d.config_path)], capture_output=True, text=True,
                               timeout=30 * TIMEOUT_SCALE, env=d._env)
        assert "smoke" in shown.stdout and "ide-tools (tools, optional" in shown.stdout, \
            shown.stdout + shown.stderr
        assert "--enable-auto-tool-choice" in shown.stdout
    finally:
        d.close()
