"""Issue 37 §1-2 end to end: the real daemon over the fake vLLM with passwords in URLs of its
environment and an API key. Nothing it writes — every log event (child.started's command
and environment), /status, the incident record's files — holds them."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.support import FAKE, Daemon, base_config, free_port, merge, wait_for
from tests.support.daemon import RECORD
from tests.support.secrets import KNOWN_KEY

SECRETS = {"DATABASE_URL": "postgres://bob:Db5ecretPw9@db.internal:5432/app",
           "HTTPS_PROXY": "http://svc:Pr0xyPw7x@proxy:3128",
           "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer 0tlpT0kenZ"}
LEAKS = ("Db5ecretPw9", "Pr0xyPw7x", "0tlpT0kenZ", "sk-DaemonKey0123456789")


def test_no_secret_leaves_the_daemon(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text(LEAKS[3] + "\n")
    key.chmod(0o600)
    cfg = merge(base_config(free_port(), free_port()),
                {"vllm": {"env": SECRETS, "api_key_file": str(key)}}, RECORD)
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", cfg)
    d.start()
    try:
        d.wait_ready(30.0)
        started = d.wait_event("child.started", 5.0)
        assert "postgres://bob:<redacted>@db.internal:5432/app" in started["command"]
        status = d.http_get("/status")[1].decode()
        since = d.mark()
        os.kill(int(started["pid"]), signal.SIGKILL)  # a crash: an incident record
        event = d.wait_event("incident.recorded", 30.0, since)
        d.wait_ready(30.0, since)
        files = {p.name: p.read_text() for p in Path(event["incident_path"]).iterdir()}
    finally:
        d.close()
    written = {"events": json.dumps(d.events), "raw": "\n".join(d.raw), "/status": status,
               **files}
    leaked = [(where, s) for where, text in written.items() for s in LEAKS if s in text]
    assert not leaked, leaked


KEY = KNOWN_KEY  # no token shape: only the known value (the key file) hides it
PLANTED = (KEY, "t0kenB3arer9", "Passw0rdUrl9")


def test_a_smoke_checks_failed_answer_leaves_no_secret(tmp_path: Path) -> None:
    """Issue 38's smoke excerpts: vLLM's failed answer quotes the API key (across the
    300 bytes the excerpt keeps), a Bearer token and a URL password; the log, /status, the
    start failure and its incident record say the check failed and hold none of them."""
    key = tmp_path / "key"
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    said = "The model does not support Messages API"
    head = json.dumps({"type": "error", "error": {"type": "BadRequestError",
                                                  "message": said}})[:-3]
    planted = tmp_path / "messages-broken"  # the fake's message ends with this text
    planted.write_text("p" * (300 - 9 - len(head)) + KEY
                       + " Bearer t0kenB3arer9 from https://u:Passw0rdUrl9@hub/x" * 4)
    cfg = merge(base_config(free_port(), free_port(),
                            ["--fake-messages-fail-while", str(planted)]),
                {"vllm": {"api_key_file": str(key)},
                 # the failed check holds READY until startup.timeout ends the start: long
                 # enough for the fake's start and its check on a loaded box (5 s was not:
                 # every start timed out before the check ran), short enough for one test
                 "startup": {"timeout": "25s"}}, RECORD)
    cfg["smoke"] = [{"endpoint": "messages"}]
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", cfg)
    d.start()
    try:
        failed = d.wait_event("smoke.failed", 60.0)
        # the key stood across the cut: hidden whole, then cut inside "<redacted>"
        assert said in failed["error"] and failed["answer"].endswith("<redacted")
        # /status shows the snapshot the loop publishes at the end of its turn, a moment
        # after smoke.failed: wait for the check's answer there, do not race it
        def answered() -> str:
            text = d.http_get("/status")[1].decode()
            checks = json.loads(text)["smoke_checks"]
            return text if any(c["result"] == "failed" for c in checks) else ""

        status = wait_for(answered, 10.0, "the failed check in /status")
        assert "<redacted>" in status
        event = d.wait_event("incident.recorded", 60.0)
        files = {p.name: p.read_text() for p in Path(event["incident_path"]).iterdir()}
        assert "smoke check 'messages'" in files["record.json"]
    finally:
        d.close()
    written = {"events": json.dumps(d.events), "raw": "\n".join(d.raw), "/status": status,
               **files}
    leaked = [(where, s[:6]) for where, text in written.items() for s in PLANTED
              if s[:6] in text]
    assert not leaked, leaked


def test_a_value_of_the_env_file_never_leaves_whatever_its_name(tmp_path: Path) -> None:
    """vllm.env_file holds "other secrets" (configure.md), and print-command shows each of
    its variables as <redacted>; but the daemon learnt only those whose names say secret, so
    `GH_PAT=...` echoed by vLLM (or a wrapper) reached the journal's child.line and the
    incident record in clear."""
    pat, endpoint = "Gp5ZpatValue", "Oa6ZargValue"
    env_file = tmp_path / "env"
    env_file.write_text(f"GH_PAT={pat}\n"
                        f"VLLMWATCH_ARG_OTLP_TRACES_ENDPOINT=https://otel/v1?k={endpoint}\n")
    env_file.chmod(0o600)
    wrapper = tmp_path / "vllm.sh"  # as vLLM logs what it was given, at its start
    wrapper.write_text("#!/bin/sh\necho \"INFO using the hub with $GH_PAT\"\n"
                       "echo \"INFO args: $*\"\nexec " + " ".join(FAKE) + " \"$@\"\n")
    wrapper.chmod(0o755)
    cfg = merge(base_config(free_port(), free_port()),
                {"vllm": {"command": [str(wrapper)], "env_file": str(env_file)}}, RECORD)
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", cfg)
    d.start()
    try:
        started = d.wait_ready(30.0)
        d.wait_event("child.line", 10.0, text="INFO using the hub with <redacted>")
        since = d.mark()
        os.kill(int(started["pid"]), signal.SIGKILL)
        event = d.wait_event("incident.recorded", 30.0, since)
        files = {p.name: p.read_text() for p in Path(event["incident_path"]).iterdir()}
    finally:
        d.close()
    written = {"events": json.dumps(d.events), "raw": "\n".join(d.raw), **files}
    leaked = [(where, s) for where, text in written.items() for s in (pat, endpoint)
              if s in text]
    assert not leaked, leaked
