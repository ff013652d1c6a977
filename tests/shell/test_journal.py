"""journald's native protocol: field names, the encoder, and the logger against a fake socket."""

from __future__ import annotations

import array
import io
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support import TIMEOUT_SCALE
from vllmwatch.shell import journal, logs


def decode(data: bytes) -> list[tuple[str, bytes]]:
    """The inverse of journal.encode, written from the protocol's description."""
    out: list[tuple[str, bytes]] = []
    i = 0
    while i < len(data):
        nl = data.index(b"\n", i)
        eq = data.find(b"=", i, nl)
        if eq != -1:
            out.append((data[i:eq].decode(), data[eq + 1:nl]))
            i = nl + 1
            continue
        name = data[i:nl].decode()
        (size,) = struct.unpack("<Q", data[nl + 1:nl + 9])
        value = data[nl + 9:nl + 9 + size]
        assert data[nl + 9 + size:nl + 10 + size] == b"\n"
        out.append((name, value))
        i = nl + 10 + size
    return out


@pytest.mark.parametrize("key,name", [
    ("reason", "VLLMWATCH_REASON"),
    ("uptime_s", "VLLMWATCH_UPTIME_S"),
    ("gpu.index", "VLLMWATCH_GPU_INDEX"),
    ("from", "VLLMWATCH_FROM"),
    ("é-x", "VLLMWATCH___X"),
    ("k" * 100, ("VLLMWATCH_" + "K" * 100)[:64]),
])
def test_field_names(key: str, name: str) -> None:
    assert journal.field_name(key) == name


@given(st.text())
def test_field_names_always_valid(key: str) -> None:
    name = journal.field_name(key)
    assert 0 < len(name) <= 64
    assert name[0].isalpha() and name[0].isupper()
    assert all(c.isupper() or c.isdigit() or c == "_" for c in name)


@pytest.mark.parametrize("value,wire", [
    ("plain", b"F=plain\n"),
    ("", b"F=\n"),
    ("a=b c", b"F=a=b c\n"),
    ("two\nlines", b"F\n" + struct.pack("<Q", 9) + b"two\nlines\n"),
    ("\n", b"F\n" + struct.pack("<Q", 1) + b"\n\n"),
    ("ünï", "F=ünï\n".encode()),
    # A NUL in the binary form too: a reader taking `NAME=value` as a C string ends it there.
    ("a\x00<0>b", b"F\n" + struct.pack("<Q", 6) + b"a\x00<0>b\n"),
])
def test_encode_table(value: str, wire: bytes) -> None:
    assert journal.encode([("F", value)]) == wire


@given(st.lists(st.tuples(st.from_regex(r"[A-Z][A-Z0-9_]{0,20}", fullmatch=True),
                          st.text(max_size=200)), max_size=8))
def test_encode_round_trips(fields: list[tuple[str, str]]) -> None:
    got = decode(journal.encode(fields))
    assert got == [(k, v.encode("utf-8", "replace")) for k, v in fields]


@given(st.text(alphabet="aé€😀\n", min_size=1, max_size=40), st.integers(0, 3))
def test_a_runaway_value_keeps_its_end_in_whole_characters(piece: str, shift: int) -> None:
    """The cut kept the start, ended inside a character (invalid UTF-8: journalctl shows
    `[N blob data]`) and dropped a process's last line, the error that ended it."""
    start = "a" * shift + piece * (journal.MAX_VALUE // len(piece.encode()) + 1)
    text = start + "\nCUDA error: an illegal memory access was encountered"
    (_, value), = decode(journal.encode([("MESSAGE", text)]))
    assert len(value) <= journal.MAX_VALUE
    shown = value.decode("utf-8")  # whole characters: strict decoding passes
    assert shown.endswith("CUDA error: an illegal memory access was encountered")
    assert shown.startswith(text[:100]) and "bytes cut ...]" in shown


def test_entry_fields_of_an_event() -> None:
    fields = dict(journal.entry_fields("warning", "restart.begin", "restart.begin reason=hang",
                                       {"reason": "hang", "uptime_s": 12.5, "pids": [1, 2]}))
    assert fields["MESSAGE"] == "restart.begin reason=hang"
    assert fields["PRIORITY"] == "4"
    assert fields["SYSLOG_IDENTIFIER"] == "vllmwatch"
    assert fields["VLLMWATCH_EVENT"] == "restart.begin"
    assert fields["MESSAGE_ID"] == journal.MESSAGE_IDS["restart.begin"]
    assert fields["VLLMWATCH_REASON"] == "hang"
    assert fields["VLLMWATCH_UPTIME_S"] == "12.5"
    assert fields["VLLMWATCH_PIDS"] == "[1,2]"
    assert fields["VLLMWATCH_SOURCE"] == "vllmwatch"


@pytest.mark.parametrize("key", ["source", "event", "Source", "EVENT"])
def test_an_event_key_named_like_our_own_fields_is_kept(key: str) -> None:
    # memory.rule_fired says which memory figure fired (source=nvml|tree|cgroup): it must
    # reach the journal beside the entry's own VLLMWATCH_SOURCE=vllmwatch, not be dropped.
    entry = journal.entry_fields("warning", "memory.rule_fired", "m", {key: "nvml", "x": 1})
    fields = dict(entry)
    assert len(fields) == len(entry)  # no field twice
    assert fields["VLLMWATCH_SOURCE"] == "vllmwatch"
    assert fields["VLLMWATCH_EVENT"] == "memory.rule_fired"
    assert fields[journal.field_name(key, prefix="VLLMWATCH_EVENT_")] == "nvml"
    assert fields["VLLMWATCH_X"] == "1"


@pytest.mark.parametrize("text,proc,pid", [
    ("(EngineCore pid=4242) INFO 11-30 load ok", "EngineCore", "4242"),
    ("(APIServer pid=7) INFO Starting vLLM server", "APIServer", "7"),
    ("(Worker_TP1 pid=99) WARNING x", "Worker_TP1", "99"),
    ("Traceback (most recent call last):", None, None),
    # behind VLLM_LOGGING_PREFIX's words and VLLM_LOGGING_COLOR's codes (vLLM 0.32 logger.py)
    ("[node-a] (EngineCore_DP0 pid=8) INFO 12-07 x", "EngineCore_DP0", "8"),
    ("INFO 12-07 [x.py:1] " + "x" * 80 + " a tuple (Name pid=3) in a message", None, None),
])
def test_vllm_lines_carry_their_process(text: str, proc: str | None, pid: str | None) -> None:
    entry = journal.entry_fields("info", "child.line", "vllm| " + text, {"pid": 1, "text": text})
    fields = dict(entry)
    assert len(fields) == len(entry)  # no field twice
    assert fields["VLLMWATCH_SOURCE"] == "vllm"
    assert "MESSAGE_ID" not in fields
    assert fields.get("VLLM_PROCESS") == proc
    assert fields.get("VLLM_PID") == pid
    # vLLM's own identifier (`journalctl -t vllm`), its text once, the launched process's pid
    # in a field that cannot be read as journald's _PID (which is vllmwatch's).
    assert fields["SYSLOG_IDENTIFIER"] == "vllm"
    assert fields["MESSAGE"] == text
    assert fields["VLLM_MAIN_PID"] == "1"
    values = [v for k, v in entry if k != "MESSAGE"]
    assert text not in values or text == ""
    assert not {k for k in fields if k in ("VLLMWATCH_PID", "VLLMWATCH_TEXT", "SYSLOG_PID")}


@pytest.mark.parametrize("event", [*sorted(journal.MESSAGE_IDS), "config.reloaded"])
def test_vllmwatch_events_keep_their_identifier(event: str) -> None:
    fields = dict(journal.entry_fields("info", event, event, {"pid": 5}))
    assert fields["SYSLOG_IDENTIFIER"] == "vllmwatch"
    assert fields["VLLMWATCH_SOURCE"] == "vllmwatch"


def test_message_ids_are_distinct_128_bit_hex() -> None:
    ids = list(journal.MESSAGE_IDS.values())
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 and i == i.lower() for i in ids)


@pytest.fixture
def fake_journald(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "journal.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5 * TIMEOUT_SCALE)
    yield path, sock
    sock.close()


def _receive(sock: socket.socket) -> dict[str, bytes]:
    fds = array.array("i")
    data, anc, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(fds.itemsize))
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:fds.itemsize])
    if fds:  # a big entry comes as a sealed memfd
        with os.fdopen(fds[0], "rb") as f:  # the sender's offset is shared: read from 0
            f.seek(0)
            data = f.read()
    return dict(decode(data))


def test_logger_sends_native_entries(fake_journald: tuple[str, socket.socket]) -> None:
    path, sock = fake_journald
    stderr = io.StringIO()
    log = logs.setup("journal", "info", stream=stderr, environ={}, journal_socket=path)
    log("warning", "restart.begin", reason="canary_timeout", detail="line one\nline two")
    log("debug", "probe.detail", x=1)  # below the level: not sent
    log("info", "child.line", pid=5, text="(EngineCore pid=6) INFO hello")
    first, second = _receive(sock), _receive(sock)
    assert first["VLLMWATCH_EVENT"] == b"restart.begin"
    assert first["VLLMWATCH_REASON"] == b"canary_timeout"
    assert first["VLLMWATCH_DETAIL"] == b"line one\nline two"
    assert first["PRIORITY"] == b"4"
    assert first["MESSAGE"].startswith(b"restart.begin reason=canary_timeout")
    assert second["VLLM_PROCESS"] == b"EngineCore" and second["VLLMWATCH_SOURCE"] == b"vllm"
    assert second["SYSLOG_IDENTIFIER"] == b"vllm" and second["VLLM_MAIN_PID"] == b"5"
    assert second["MESSAGE"] == b"(EngineCore pid=6) INFO hello"
    assert "VLLMWATCH_TEXT" not in second and "VLLMWATCH_PID" not in second
    assert stderr.getvalue() == ""


def test_a_big_entry_goes_through_a_memfd(fake_journald: tuple[str, socket.socket]) -> None:
    path, sock = fake_journald
    log = logs.setup("journal", "info", stream=io.StringIO(), environ={}, journal_socket=path)
    big = {f"part{i}": "y" * 60_000 for i in range(8)}  # ~480 KB: more than a datagram
    log("error", "crashloop.gave_up", **big)
    got = _receive(sock)
    assert got["VLLMWATCH_EVENT"] == b"crashloop.gave_up"
    assert all(len(got[f"VLLMWATCH_PART{i}"]) == 60_000 for i in range(8))


def test_without_journald_events_go_to_stderr(tmp_path: Path) -> None:
    stderr = io.StringIO()
    log = logs.setup("journal", "info", stream=stderr, environ={},
                     journal_socket=str(tmp_path / "missing.sock"))
    log("warning", "restart.begin", reason="hang")
    assert stderr.getvalue() == "<4>restart.begin reason=hang\n"


def test_a_dead_journald_falls_back_to_stderr(fake_journald: tuple[str, socket.socket]) -> None:
    path, sock = fake_journald
    stderr = io.StringIO()
    log = logs.setup("journal", "info", stream=stderr, environ={}, journal_socket=path)
    sock.close()
    os.unlink(path)  # journald gone after we started
    log("error", "daemon.exit", code=3)
    assert stderr.getvalue() == "<3>daemon.exit code=3\n"


class _Pipe(io.StringIO):
    def isatty(self) -> bool:
        return False


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("wanted,stream,expected", [
    ("auto", _Pipe(), "json"),  # a container's stdout: JSON lines
    ("auto", _Tty(), "console"),
    ("journal", _Pipe(), "journal"),
    ("console", _Pipe(), "console"),
])
def test_choose_format(wanted: str, stream: io.StringIO, expected: str) -> None:
    assert logs.choose_format(wanted, {}, stream) == expected


def test_auto_under_journald_sends_native_entries(fake_journald: tuple[str, socket.socket],
                                                  tmp_path: Path) -> None:
    """JOURNAL_STREAM naming our stderr (as systemd sets it) picks the native protocol."""
    path, sock = fake_journald
    with (tmp_path / "stderr").open("w") as stream:
        st = os.fstat(stream.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        log = logs.setup("auto", "info", stream=stream, environ=env, journal_socket=path)
        log("info", "child.ready", startup_s=31.5)
    got = _receive(sock)
    assert got["MESSAGE_ID"] == journal.MESSAGE_IDS["child.ready"].encode()
    assert got["VLLMWATCH_STARTUP_S"] == b"31.5"
    assert (tmp_path / "stderr").read_text() == ""
    # Another stderr (the variable inherited by a child process): not journald.
    assert logs.choose_format("auto", {"JOURNAL_STREAM": "1:2"}, _Pipe()) == "json"


def test_a_coloured_vllm_line_carries_its_process() -> None:
    """VLLM_LOGGING_COLOR=1 colours the prefix even into a pipe: the codes are no part of it."""
    text = "\x1b[36m(ApiServer_1 pid=9)\x1b[0m INFO 12-07 x"
    fields = dict(journal.entry_fields("info", "child.line", "vllm| " + text,
                                       {"pid": 1, "text": text}))
    assert (fields.get("VLLM_PROCESS"), fields.get("VLLM_PID")) == ("ApiServer_1", "9")
