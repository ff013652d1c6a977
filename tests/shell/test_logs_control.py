"""No control character reaches a log stream raw, whatever vLLM prints or a field carries.

A vLLM line `INFO hello\\x00<0>daemon.exit ...` was written to stderr as it was: journald's
stdout stream splits at NUL and reads `<N>` per piece, so it became an emergency-level
entry under vllmwatch's identifier; the console format passed ESC and `\\r` to the operator's
terminal; the JSON format left DEL and the C1 controls (U+009B is CSI, U+0085 a line break
to str.splitlines) raw.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest

from tests.support import TIMEOUT_SCALE
from vllmwatch.shell import journal, logs
from vllmwatch.shell.childlog import ChildLog

FORGED = b'INFO hello\x00<0>daemon.exit code=0 reason=stop detail="stopped on request"\n'
NASTY = "a\x00b\x1b[2J\rc\x07d\x7fe\x85f\x9b31mg\nh\x0bi"  # NUL ESC CR BEL DEL NEL CSI LF VT
# Anything a terminal or journald acts on; tab is allowed (printable keeps it).
RAW = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
STREAM_FORMATS = ["journal", "console", "json"]


def _setup(fmt: str) -> tuple[io.StringIO, logs.LogFn]:
    """A logger in `fmt` writing to a string; `journal` with no native socket (the fallback)."""
    out = io.StringIO()
    log = logs.setup(fmt, "info", stream=out, environ={}, journal_socket="/nonexistent/socket")
    return out, log


def _lines(out: io.StringIO) -> list[str]:
    text = out.getvalue()
    assert text.endswith("\n")
    lines = text[:-1].split("\n")
    for line in lines:
        assert not RAW.search(line), repr(line)
    return lines


def _forward(data: bytes, log: logs.LogFn) -> None:
    child = ChildLog(io.BytesIO(data), 7, [].append, log)
    child.start()
    child.join(10 * TIMEOUT_SCALE)  # both threads end at the stream's end


def test_a_forged_entry_in_a_vllm_line_stays_one_escaped_line_in_the_journal_fallback() -> None:
    out, log = _setup("journal")
    _forward(FORGED, log)
    assert "\x00" not in out.getvalue()
    assert _lines(out) == ['<6>vllm| INFO hello\\x00<0>daemon.exit code=0 reason=stop '
                           'detail="stopped on request"']


@pytest.mark.parametrize("fmt", STREAM_FORMATS)
def test_a_vllm_line_with_control_characters_is_one_line_with_them_escaped(fmt: str) -> None:
    out, log = _setup(fmt)
    sent = NASTY.replace("\n", "").replace("\r", "")  # (a \r is a redraw: the next test)
    _forward(b"INFO " + sent.encode() + b"\tend\n", log)
    (line,) = _lines(out)
    if fmt == "json":  # escaped by JSON: the text reads back exactly
        assert json.loads(line)["text"] == "INFO " + sent + "\tend"
    else:
        assert line.endswith("vllm| INFO a\\x00b\\x1b[2Jc\\x07d\\x7fe\\x85f\\x9b31mgh\\x0bi"
                             "\tend")


@pytest.mark.parametrize("fmt", STREAM_FORMATS)
def test_a_progress_bar_redrawn_with_cr_is_its_last_draw(fmt: str) -> None:
    """tqdm to a pipe writes every draw after a \r on one line; a terminal shows the last."""
    out, log = _setup(fmt)
    bar = b"Loading shards:   0% 0/4\rLoading shards:  50% 2/4\rLoading shards: 100% 4/4\r  \n"
    _forward(b"INFO before\n" + bar + b"INFO after\n", log)
    lines = _lines(out)
    texts = [json.loads(x)["text"] for x in lines] if fmt == "json" else lines
    assert len(texts) == 3 and texts[1].endswith("Loading shards: 100% 4/4"), texts
    assert not any("0/4" in t or "\\x0d" in t for t in texts), texts


def test_a_vllm_line_in_the_native_journal_is_text_journalctl_shows() -> None:
    """journalctl prints an entry whose MESSAGE holds a control character as "[N blob
    data]": vLLM's line is sent with them escaped."""
    fields = dict(journal.entry_fields("info", "child.line", "", {"text": "a\x1b[31mb\x00c"}))
    assert fields["MESSAGE"] == "a\\x1b[31mb\\x00c"


def test_our_own_events_in_the_native_journal_are_text_journalctl_shows() -> None:
    """vllmwatch's own events quote what vLLM printed (child.exited's last lines, an
    error's detail): their MESSAGE and every field had the raw bytes, shown as blobs."""
    given: dict[str, Any] = {"detail": NASTY, "last_lines": [NASTY, "ok"], "word": "x\x00y",
                             "code": 1, "multi": "line one\nline two\tend"}
    fields = journal.entry_fields("error", "child.exited", f"vLLM exited: {NASTY}", given)
    for name, value in fields:  # newline and tab kept: journalctl prints them
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", value), (name, value)
    got = dict(fields)
    assert got["VLLMWATCH_WORD"] == "x\\x00y" and got["VLLMWATCH_CODE"] == "1"
    assert got["VLLMWATCH_MULTI"] == "line one\nline two\tend"  # journalctl prints these


@pytest.mark.parametrize("fmt", STREAM_FORMATS)
def test_our_own_event_fields_are_escaped_too(fmt: str) -> None:
    """child.exited quotes vLLM's last lines; any text field may carry what vLLM printed."""
    out, log = _setup(fmt)
    fields: dict[str, Any] = {"code": 1, "last_lines": [NASTY, "ok"], "detail": NASTY,
                              "word": "x\x00<0>y", NASTY: "key"}
    log("error", "child.exited", **fields)
    (line,) = _lines(out)
    if fmt == "json":
        doc = json.loads(line)
        assert {k: doc[k] for k in fields} == fields
    else:
        assert "word=x\\x00<0>y" in line and "\\x1b[2J" in line and "\\x9b31m" in line


def test_the_console_colour_is_the_only_escape_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    log = logs.setup("console", "info", stream=out, environ={})
    log("warning", "child.exited", detail=NASTY)
    line = out.getvalue()
    assert line.count("\x1b") == 2 and "\x1b[33mWARN\x1b[0m " in line  # the tag's colour
    assert not RAW.search(line.replace("\x1b[33mWARN\x1b[0m", "")[:-1]), repr(line)


@pytest.mark.parametrize("fmt", STREAM_FORMATS)
def test_line_separators_and_bidi_overrides_are_escaped(fmt: str) -> None:
    """U+2028/U+2029 break a line in some viewers, and the bidi overrides and isolates show a
    text in another order than its bytes (`...\u202etxt.exe` reads as `exe.txt`): a vLLM
    line or a field with one passed raw."""
    tricky = "evil\u2028forged entry \u202egnp.exe\u2066x\u2069 \u2029end"
    out, log = _setup(fmt)
    log("error", "child.exited", detail=tricky)
    _forward(f"INFO {tricky}\n".encode(), log)
    lines = _lines(out)
    assert len(lines) == 2, lines
    for line in lines:
        assert not re.search("[\u2028-\u202e\u2066-\u2069]", line), repr(line)
        if fmt != "json":  # JSON writes them as \u escapes of its own
            assert "\\u2028" in line and "\\u202e" in line, line
    native = dict(journal.entry_fields("error", "child.exited", tricky, {"detail": tricky}))
    assert "\\u202e" in native["MESSAGE"] and "\\u2028" in native["VLLMWATCH_DETAIL"]
