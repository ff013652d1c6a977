"""`vllmwatch status` under bad input: one clear line and a documented exit code, never a
traceback (bad --url, refused, not JSON, foreign JSON, odd shapes, an unloadable config)."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import TIMEOUT_SCALE
from vllmwatch.status import cli as status_cli
from vllmwatch.status.snapshot import Snapshot

GOOD = Snapshot(state="ready", ready=True).to_json()


@contextmanager
def serving(body: bytes, status: int = 200,
            content_type: str = "application/json") -> Iterator[str]:
    """A one-purpose HTTP server on loopback answering every GET with body."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def run_cli(capsys: pytest.CaptureFixture[str], url: str | None, config: str | None = None,
            as_json: bool = False) -> tuple[int, str, str]:
    code = status_cli.main(config, url, as_json)
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out
    return code, out.out, out.err


@pytest.mark.parametrize("url", ["http://[::1", "ftp://127.0.0.1:9101", "http://:9101",
                                 "http://127.0.0.1:99999", "http://127.0.0.1:port",
                                 "http://127.0.0.1:0", "a b:9101", "http://"])
def test_bad_url_is_a_usage_error(capsys: pytest.CaptureFixture[str], url: str) -> None:
    code, _, err = run_cli(capsys, url)
    assert code == 2 and "bad --url" in err


def test_refused_means_not_running(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = run_cli(capsys, f"127.0.0.1:{port}")
    assert code == 3 and "not running" in err


@pytest.mark.parametrize("body", [b"<html>hello</html>", b"\xff\xfe\x00", b""])
def test_non_json_answer(capsys: pytest.CaptureFixture[str], body: bytes) -> None:
    with serving(body, content_type="text/html") as url:
        code, _, err = run_cli(capsys, url)
    assert code == 1 and "another service" in err


@pytest.mark.parametrize("doc", [[], 5, "ready", None, {"status": "ok"},
                                 {"state": "ready", "ready": True},
                                 {**GOOD, "state": 3}])
@pytest.mark.parametrize("as_json", [False, True])
def test_foreign_json_is_refused(capsys: pytest.CaptureFixture[str], doc: object,
                                 as_json: bool) -> None:
    with serving(json.dumps(doc).encode()) as url:
        code, out, err = run_cli(capsys, url, as_json=as_json)
    assert code == 1 and "not vllmwatch's /status" in err and out == ""


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from([*sorted(GOOD), "state_for_s", "extra"]),
                       st.recursive(st.none() | st.booleans() | st.floats() | st.integers()
                                    | st.text(max_size=5)
                                    # past a float's range: float() raised OverflowError
                                    | st.integers(min_value=10**308) | st.just(-10**400),
                                    lambda inner: st.lists(inner, max_size=3)
                                    | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                                    max_leaves=8)))
def test_render_survives_any_shape(fields: dict[str, Any]) -> None:
    text = status_cli.render({**GOOD, **fields})
    assert text.startswith("state")


@pytest.mark.parametrize("body", [b"[" * 200_000 + b"]" * 200_000,
                                  b'{"a":' * 100_000 + b"1" + b"}" * 100_000])
def test_json_nested_past_the_stack_is_one_line(capsys: pytest.CaptureFixture[str],
                                                body: bytes) -> None:
    """json.loads raised RecursionError, which is not a ValueError: "unexpected error"."""
    with serving(body) as url:
        code, out, err = run_cli(capsys, url)
    assert code == 1 and "nested deeper" in err and out == ""


def test_numbers_past_a_floats_range_render(capsys: pytest.CaptureFixture[str]) -> None:
    """10**400 as a pid or a count: float() raised OverflowError out of the status line."""
    doc = {**GOOD, "child_pid": 10**400, "vllm_running": -10**400,
           "spare": {"state": "asleep", "memory_mib": 10**400}}
    with serving(json.dumps(doc).encode()) as url:
        code, out, _ = run_cli(capsys, url)
    assert code == 0 and "ready" in out


def test_odd_shapes_render_through_main(capsys: pytest.CaptureFixture[str]) -> None:
    doc = {**GOOD, "restarts_by_reason": {"hang": "two"}, "memory": [1, 2],
           "child_pid": "x", "state_for_s": float("inf"), "start_phases_s": None}
    with serving(json.dumps(doc).encode()) as url:
        code, out, _ = run_cli(capsys, url)
    assert code == 0 and "ready" in out


def test_unloadable_config_is_reported_not_replaced_by_the_default(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[vllm]\nmodel = "/m"\n[probe]\ninterval = nan\n')
    code, _, err = run_cli(capsys, None, str(path))
    assert code == 2 and "probe.interval" in err and "--url" in err
    code, _, err = run_cli(capsys, None, str(tmp_path / "missing.toml"))
    assert code == 2 and "file not found" in err


def test_url_wins_over_a_broken_config(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("not toml [")
    with serving(json.dumps(GOOD).encode()) as url:
        code, out, _ = run_cli(capsys, url, str(path))
    assert code == 0 and "ready" in out


def test_the_command_line_never_prints_a_traceback(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "vllmwatch", "status", "--url", "http://[::1"],
                         capture_output=True, text=True, timeout=60 * TIMEOUT_SCALE, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "bad --url" in out.stderr


def test_control_characters_from_the_answer_never_reach_the_terminal(
        capsys: pytest.CaptureFixture[str]) -> None:
    # A foreign service (or one that bound the port first) can answer anything: an ESC
    # sequence could retitle the terminal or rewrite the lines above.
    doc = {**GOOD, "state": "ready\x1b]0;owned\x07", "last_reason": "crash\x1b[2J",
           "last_reason_detail": "a\nb\rc\x9bd", "restarts_by_reason": {"x\x1b[1A": 1},
           "config_path": "/etc/\x00v.toml", "memory": {"source": "nvml\x1b[31m"},
           "launch": "fresh\x7f", "standby_state": "off", "standby_reason": "\x1b[8mhidden"}
    with serving(json.dumps(doc).encode()) as url:
        code, out, _ = run_cli(capsys, url)
    assert code == 0
    for raw in ("\x1b", "\x07", "\x00", "\x9b", "\x7f", "\r"):
        assert raw not in out, repr(raw)
    assert "ready\\x1b]0;owned\\x07" in out and "a\\nb\\x0dc\\x9bd" in out
    # one more row than GOOD ("last"), and no line broken by a newline in the answer
    assert out.count("\n") == len(status_cli.render(GOOD).splitlines()) + 1


@pytest.mark.parametrize("ready,draining,shown", [
    (True, False, "yes"), (False, False, "no"), ("no", False, "no"), (1, False, "no"),
    ("false", None, "no"), (True, "no", "yes"), (True, True, "no"), (None, None, "no"),
])
def test_ready_is_yes_only_for_true(ready: object, draining: object, shown: str) -> None:
    """An answer whose `ready` is "no" or 1 (a foreign service, an odd version) read
    `ready yes`: only JSON true is a yes, and only JSON true drains."""
    from vllmwatch.status import view

    text = view.render({"state": "ready", "ready": ready, "draining": draining})
    assert [line.split() for line in text.splitlines() if line.split()[:1] == ["ready"]] == [
        ["ready", shown]], text


@pytest.mark.parametrize(("given", "url"), [
    ("http://127.0.0.1:9101#x", "http://127.0.0.1:9101/status"),  # asked / before
    ("127.0.0.1:9101/", "http://127.0.0.1:9101/status"),
    ("http://[::1]:9101/status?x=1#y", "http://[::1]:9101/status?x=1"),
    ("http://h:9101/other", "http://h:9101/other"),
])
def test_the_status_url_asks_for_status(given: str, url: str) -> None:
    from vllmwatch.status.cli import status_url
    assert status_url(given) == url


def test_a_record_from_before_this_vllmwatch_is_shown_beside_its_zero_restarts(
        capsys: pytest.CaptureFixture[str]) -> None:
    """systemd restarted vllmwatch 10 s after its crash-loop give-up (exit 75): status read
    `restarts  0` and no incident row, as if nothing had happened; the give-up's record was
    in the unit's folder. A vllmwatch that wrote no record of its own shows the unit's newest,
    said to be from before it started; its own record is its incident row, as before."""
    rec = {"id": "20261206T190649Z-crashloop", "time": "2026-12-06T19:06:49Z",
           "reason": "crashloop", "detail": "3 failures within 1h00m, 2 restarted"}
    asked: list[str] = []

    def finder(unit: str) -> dict[str, Any]:
        asked.append(unit)
        return rec
    with serving(json.dumps(GOOD).encode()) as url:
        assert status_cli.main(None, url, False, finder) == 0
    out = capsys.readouterr().out
    assert asked == ["vllmwatch.service"], asked
    rows = [line for line in out.splitlines() if line.startswith("before")]
    assert rows and rec["id"] in rows[0] and "crashloop: 3 failures" in rows[0], out
    assert f"read it: vllmwatch incidents show {rec['id']}" in out, out
    own = {**GOOD, "last_incident": "20261206T200000Z-hang", "incidents_total": 1}

    def fails(unit: str) -> dict[str, Any]:
        raise PermissionError(13, "denied")
    for doc, find in ((own, finder), (GOOD, fails), (GOOD, lambda u: {"denied": "/x"}),
                      (GOOD, lambda u: None)):
        with serving(json.dumps(doc).encode()) as url:
            assert status_cli.main(None, url, False, find) == 0
        got = capsys.readouterr()
        assert "before" not in got.out and "Traceback" not in got.err, got
    with serving(json.dumps(GOOD).encode()) as url:  # --json: the document as it came
        assert status_cli.main(None, url, True, finder) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(GOOD))


def test_the_record_shown_says_how_old_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    """The unit's newest record may be last month's: the `before` row (and the not-running
    `incident last:` row) showed it as if it were the cause of today's start. Each says its
    age; a time that is not UTC ISO is shown as it is, with no age."""
    import time

    from vllmwatch.status import stopped

    month = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 30 * 86400 - 7200))
    rec = {"id": "old-crashloop", "time": month, "reason": "crashloop", "detail": ""}
    with serving(json.dumps(GOOD).encode()) as url:
        assert status_cli.main(None, url, False, lambda u: rec) == 0
    [row] = [r for r in capsys.readouterr().out.splitlines() if r.startswith("before")]
    assert f"old-crashloop at {month} (30d02h ago), before this vllmwatch" in row, row
    text = stopped.explain("http://x", "/x.toml", None, rec)
    assert f"incident  last: old-crashloop (crashloop) at {month} (30d02h ago)" in text, text
    assert stopped.written({"time": "yesterday"}) == " at yesterday"
    assert stopped.written({"time": "2026-12-06T19:06:49Z"}, now=1796584009.0 + 95) == \
        " at 2026-12-06T19:06:49Z (1m35s ago)"
    assert stopped.written({"time": ""}) == ""
