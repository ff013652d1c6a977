"""Issue 37 §1-2: a secret of any form never leaves through any writer — the incident
record's files (record.json, report.txt, output.log, the stack files, thread names), the log
(journal fields and stderr, child.started's command and environment), /status, the gate's
messages, `vllmwatch incidents` list and show, `vllmwatch status`, print-command. One
property, every writer."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings

from tests.support import TIMEOUT_SCALE
from tests.support.secrets import known_key, leaks
from vllmwatch.config.command import ChildCommand
from vllmwatch.config.redact import Redactor
from vllmwatch.gate import guard, proxy
from vllmwatch.incident import cli as incidents_cli
from vllmwatch.incident import dumpers, record, store
from vllmwatch.shell import logs
from vllmwatch.status import cli as status_cli
from vllmwatch.status.server import StatusServer
from vllmwatch.status.snapshot import Snapshot

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def journald(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path_factory.mktemp("j") / "socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(10 * TIMEOUT_SCALE)
    yield path, sock
    sock.close()


def _record_files(text: str) -> dict[str, str]:
    inp = record.Inputs(seq=1, reason="hang", detail=f"canary failed: {text}", exit_code=None,
                        timeout=3.0, pgid=None, child_pid=None,
                        facts={"uptime_s": 5.0, "env_seen": text},
                        output=["INFO starting", text, f"(APIServer pid=7) {text}"],
                        status={"last_reason_detail": text, "command": text})
    thread = dumpers.Thread(f"poller {text}", (dumpers.Frame(f"f {text}", "vllm/x.py", 3),))
    stacks: record.StackDumps = [(7, [dumpers.Dump("py-spy", True, (thread,),
                                                   raw=f'Thread 7 (idle): "{text}"\n'),
                                      dumpers.Dump("faulthandler", False, error=text,
                                                   raw=f"File {text}")])]
    procs = [record.Proc(7, 1, "api_server", f"vllm serve /m {text}", "S", 100.0, 4)]
    built = record.build(inp, "20261201T000000Z-hang", 10.0, procs, stacks,
                         {"py-spy": text}, Redactor())
    return record.files_of(built, stacks, Redactor())


def _logged(text: str, secret: str, journal: tuple[str, socket.socket]) -> list[str]:
    fields = {"pid": 7, "command": f"vllm serve /m {text}", "launch": "fresh",
              "env": {"DATABASE_URL": text, "EXTRA": text}, "argv": ["vllm", text],
              "args": ["vllm", "serve", "--api-key", secret, "--port", "8000"]}
    out = []
    for fmt in ("json", "console"):
        stream = io.StringIO()
        log = logs.setup(fmt, "info", stream=stream, environ={})
        log("info", "child.started", **fields)
        log("warning", "child.line", pid=7, text=text)
        out.append(stream.getvalue())
    path, sock = journal
    log = logs.setup("journal", "info", stream=io.StringIO(), environ={}, journal_socket=path)
    log("info", "child.started", **fields)
    out.append(sock.recv(1 << 20).decode("utf-8", "replace"))
    return out


def _status(text: str) -> str:
    snap = Snapshot(state="starting", last_reason="crash", last_reason_detail=text,
                    model=text)
    server = StatusServer("127.0.0.1:0", False, lambda: snap, lambda *a, **k: None)
    return json.dumps(server.status_json(snap))


def _status_cli(text: str) -> str:
    # Whatever answered on the status port (an older vllmwatch): printed through the rules.
    data = status_cli.parse(json.dumps({
        "state": "ready", "ready": True, "vllmwatch_version": "1", "restarts_by_reason": {},
        "last_reason": "crash", "last_reason_detail": text, "model": text}), "http://x")
    return status_cli.render(data) + json.dumps(data)


def _gate(text: str) -> list[str]:
    return [proxy._error(path, 502, f"vLLM refused: {text}").text or ""
            for path in ("/v1/completions", "/v1/messages")] + \
        [guard._refuse(path, 503, f"no: {text}").text or ""
         for path in ("/v1/completions", "/v1/messages")]


def _incidents_cli(text: str, root: Path, capsys: pytest.CaptureFixture[str]) -> str:
    # A record written raw (an older vllmwatch, or a hand-edit): the CLI redacts on the way out.
    rid = "20261201T000000Z-hang"
    folder = root / rid
    folder.mkdir(parents=True, exist_ok=True)
    (folder / store.RECORD).write_text(json.dumps({
        "id": rid, "reason": "hang", "detail": text, "time_utc": "2026-12-01T00:00:00Z",
        "output": [text], "tree": {"note": text, "processes": []},
        "stacks": {"processes": [{"pid": 7, "role": "api_server", "dumps": [
            {"method": "py-spy", "ok": True, "threads": [{"name": text, "frames": []}]}]}]}}))
    capsys.readouterr()
    for args in ((None, None, False), (None, None, True), ("show", rid, False),
                 ("show", rid, True)):
        incidents_cli.main(*args, [str(root)])
    got = capsys.readouterr()
    return got.out + got.err


@SETTINGS
@given(leak=leaks())
# a value that begins with dashes, then a digit or `_`: child.started's argv took it for a flag
@example(leak=("password --00000A", "--00000A"))
@example(leak=("--api-key --_x9Yab3", "--_x9Yab3"))
@example(leak=("HF_TOKEN=-9aB3kx0", "-9aB3kx0"))
def test_a_secret_never_leaves_through_any_writer(
        leak: tuple[str, str], journald: tuple[str, socket.socket], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    text, secret = leak
    written = {f"record {name}": body for name, body in _record_files(text).items()}
    written |= {f"log {i}": body for i, body in enumerate(_logged(text, secret, journald))}
    written["/status"] = _status(text)
    written["vllmwatch status"] = _status_cli(text)
    written |= {f"gate {i}": body for i, body in enumerate(_gate(text))}
    written["incidents"] = _incidents_cli(text, tmp_path / "incidents", capsys)
    written["print-command"] = ChildCommand(("vllm", "serve", "/m", text),
                                            {"X_URL": text}, {"X_URL": text}).display()
    leaked = [where for where, body in written.items() if secret in body]
    assert not leaked, f"{secret!r} leaked through {leaked}"


def test_every_record_file_is_covered_and_useful_text_stays() -> None:
    files = _record_files("--model /models/llama --port 8000")
    assert set(files) == {"record.json", "report.txt", "output.log",
                          "stacks-7-py-spy.txt", "stacks-7-faulthandler.txt"}
    assert "--model /models/llama --port 8000" in files["output.log"]


def test_the_log_still_says_what_is_not_secret() -> None:
    stream = io.StringIO()
    logs.setup("json", "info", stream=stream, environ={})(
        "info", "child.started", command="vllm serve /models/x --port 8000", pid=3)
    event = json.loads(stream.getvalue())
    assert event["command"] == "vllm serve /models/x --port 8000" and event["pid"] == 3


@pytest.mark.parametrize("cut", [5, 15])
def test_the_spares_canary_detail_is_redacted_before_it_is_cut(
        monkeypatch: pytest.MonkeyPatch, cut: int) -> None:
    """The spare's canary failure (its spare.* events and /status say it) quotes vLLM's
    answer: the API key across the 200 bytes it keeps is hidden whole."""
    from vllmwatch.shell import sparetree

    key = known_key(monkeypatch)  # shell/sparefx.make learns the spare's when it is built
    answer = b"e" * (200 - cut) + key.encode() + b" Bearer t0kenB3arer9" * 5
    monkeypatch.setattr(sparetree, "call", lambda *a, **k: (500, answer))
    tree_ = sparetree.SpareTree(sparetree.SpareCommand(["vllm"], {}, "/nonexistent", "m"),
                                "i" * 16, lambda *a, **k: None, lambda pids: None,
                                lambda: None)
    said = tree_.canary(1.0)
    assert said.startswith("canary: HTTP 500")
    for piece in (key[:4], "t0kenB3"):
        assert piece not in said, said
