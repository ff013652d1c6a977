"""journald's native protocol: one event, one journal entry with fields.

The protocol (systemd.io/JOURNAL_NATIVE_PROTOCOL) is a datagram of `NAME=value\\n` fields to
/run/systemd/journal/socket; a value with a newline or a NUL is sent as `NAME\\n` + its length
as a 64-bit little-endian integer + the bytes + `\\n`. An entry too big for a datagram goes in a
sealed memfd passed with SCM_RIGHTS. No library is needed for that, and the one binding
(systemd-python) needs libsystemd headers to build.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import socket
import stat
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from vllmwatch.config.convert import printable

SOCKET = "/run/systemd/journal/socket"
IDENTIFIER = "vllmwatch"
# vLLM's forwarded lines are vLLM's, not ours: `journalctl -t vllm` finds them and
# `journalctl -t vllmwatch` shows vllmwatch's events alone (`-u vllmwatch` shows both).
VLLM_IDENTIFIER = "vllm"
PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}
MAX_VALUE = 64 * 1024  # per field: a runaway value must not make every entry a memfd

# A fixed 128-bit id per event an operator searches for: `journalctl MESSAGE_ID=...` finds
# it whatever the text says. Never change one; add new ones at the end. Listed in
# docs/operations/logs.md.
MESSAGE_IDS = {
    "restart.begin": "07d6cdd7e18741f9a79ea8dc22cdeeb2",
    "restart.done": "aa2dc97b526d441f8a290404284c52a8",
    "crashloop.gave_up": "57f6ce21a5bf4076820b14c11450232e",
    "child.ready": "df1acc190c274016a93635d85a3522ac",
    "memory.rule_fired": "12b837451e544b70b94622a4f6fbd431",
    "daemon.exit": "b863c3f0e13d4b459a01ca7e21f6b59f",
    "child.exited": "5aa774d547c14a23a1b8c58c8e51d954",
    "probe.canary_timeout": "48009a55df4e4892a6d5b1d06e03503f",
    "gpu.fault": "ef725ad401a24551bd6a6e64800d79df",
    "daemon.start": "ee299afd57b34af38ff92ce175201de3",
    "child.unkillable": "bad50f4217d7483fabd3045ba125ec82",
    "reaper.reaped": "16ce271460bf4f6f98ebe343270061f7",
    "daemon.exiting": "845aec2b3a894ac0b0e895ebf2dbf4b8",
}

# vLLM prefixes its lines with the process that wrote them: "(EngineCore pid=123) ...",
# behind VLLM_LOGGING_PREFIX's words and colour codes when set (incident/cause.py body)
_VLLM_PREFIX = re.compile(r"\((?P<proc>[A-Za-z_][\w.-]*) pid=(?P<pid>\d+)\)")
_SGR = re.compile(r"\x1b\[[0-9;]*m")
_HEAD = 80  # where the prefix may be
_BAD = re.compile(r"[^A-Z0-9_]")


# The fields every entry of ours carries: an event key that maps onto one of them (the
# memory rule's `source`: nvml, tree or cgroup) would be dropped, so it gets VLLMWATCH_EVENT_<KEY>.
_OURS = frozenset({"VLLMWATCH_EVENT", "VLLMWATCH_SOURCE"})


def field_name(key: str, prefix: str = "VLLMWATCH_") -> str:
    """A journal field name for `key`: uppercase A-Z, 0-9, _; no leading _; <= 64 chars."""
    name = prefix + _BAD.sub("_", key.upper())
    name = name.lstrip("_") or "FIELD"
    if name[0].isdigit():
        name = "F" + name
    return name[:64]


def text_of(value: Any) -> str:
    """A field value as text: strings as they are, everything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))


def entry_fields(level: str, event: str, message: str, fields: Mapping[str, Any],
                 identifier: str = IDENTIFIER) -> list[tuple[str, str]]:
    """The journal fields of one event, in order; MESSAGE first."""
    if event == "child.line":
        return _vllm_line(level, fields)
    # Control characters as escapes, as in every other format: journalctl shows a field
    # with a raw one as "[N blob data]" (a field may quote what vLLM printed)
    out = [("MESSAGE", printable(message)), ("PRIORITY", str(PRIORITY.get(level, 6))),
           ("SYSLOG_IDENTIFIER", identifier), ("VLLMWATCH_EVENT", event)]
    if event in MESSAGE_IDS:
        out.append(("MESSAGE_ID", MESSAGE_IDS[event]))
    out.append(("VLLMWATCH_SOURCE", "vllmwatch"))
    taken = {name for name, _ in out}
    for key, value in fields.items():
        name = field_name(key)
        if name in _OURS:  # an event's own `source` or `event` key: kept, under its own name
            name = field_name(key, prefix="VLLMWATCH_EVENT_")
        if name not in taken:  # a key that sanitises onto another keeps the first
            taken.add(name)
            out.append((name, printable(text_of(value))))
    return out


def _vllm_line(level: str, fields: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A forwarded vLLM line: vLLM's text as MESSAGE (not repeated in another field), under
    vLLM's own identifier. The pid of the process vllmwatch launched is VLLM_MAIN_PID (never
    a VLLMWATCH_PID beside journald's _PID, which is vllmwatch's); the process that wrote the
    line, where vLLM's prefix names it, is VLLM_PROCESS and VLLM_PID; VLLM_ENGINE=spare marks
    the sleeping spare engine's lines."""
    # Its controls as escapes: journalctl shows an entry with a raw one as "[N blob data]"
    text = printable(text_of(fields.get("text", "")))
    out = [("MESSAGE", text), ("PRIORITY", str(PRIORITY.get(level, 6))),
           ("SYSLOG_IDENTIFIER", VLLM_IDENTIFIER), ("VLLMWATCH_EVENT", "child.line"),
           ("VLLMWATCH_SOURCE", "vllm")]
    if fields.get("pid") is not None:
        out.append(("VLLM_MAIN_PID", text_of(fields["pid"])))
    if fields.get("engine"):  # "spare": the sleeping spare engine's line, not the serving one's
        out.append(("VLLM_ENGINE", text_of(fields["engine"])))
    if fields.get("build"):  # the spare's build (its events' build=)
        out.append(("VLLM_SPARE_BUILD", text_of(fields["build"])))
    match = _VLLM_PREFIX.search(_SGR.sub("", text) if "\x1b" in text else text, 0, _HEAD)
    if match:
        out += [("VLLM_PROCESS", match["proc"]), ("VLLM_PID", match["pid"])]
    return out


def encode(fields: Iterable[tuple[str, str]]) -> bytes:
    """The native-protocol datagram for these fields (binary-safe, values capped)."""
    parts: list[bytes] = []
    for name, value in fields:
        data = value.encode("utf-8", "replace")
        if len(data) > MAX_VALUE:
            data = _cut(data)
        key = name.encode("ascii")
        # The binary form for a NUL too: the protocol's `NAME=value` form is for text, and a
        # reader that takes the value as a C string would end it at the NUL.
        if b"\n" in data or b"\0" in data:
            parts.append(key + b"\n" + struct.pack("<Q", len(data)) + data + b"\n")
        else:
            parts.append(key + b"=" + data + b"\n")
    return b"".join(parts)


def _cut(data: bytes) -> bytes:
    """The start and the end of a value over MAX_VALUE, whole UTF-8 characters (a cut inside
    one made journalctl show `[N blob data]`): the end holds a process's last lines, where
    the error that ended it is (`child.exited`)."""
    keep = (MAX_VALUE - 64) // 2
    head = data[:keep].decode("utf-8", "ignore").encode()
    tail = data[-keep:].decode("utf-8", "ignore").encode()
    return head + f" [... {len(data) - len(head) - len(tail)} bytes cut ...] ".encode() + tail


def available(path: str = SOCKET) -> bool:
    """True when journald's native socket exists here."""
    with contextlib.suppress(OSError):
        return stat.S_ISSOCK(os.stat(path).st_mode)
    return False


class JournalSender:
    """Send entries to journald; `send` returns False so the caller can fall back."""

    def __init__(self, path: str = SOCKET) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def send(self, data: bytes) -> bool:
        """One entry; a datagram, or a sealed memfd when it is too big for one."""
        try:
            self._sock.sendto(data, self.path)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EMSGSIZE, errno.ENOBUFS):  # too big for a datagram
                return False
        return self._send_memfd(data)

    def _send_memfd(self, data: bytes) -> bool:
        try:
            fd = os.memfd_create("vllmwatch-journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except (OSError, AttributeError):
            return False
        try:
            os.write(fd, data)
            # journald only accepts a memfd that can no longer change.
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                        | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
            self._sock.sendmsg([], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                     struct.pack("i", fd))], 0, self.path)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()
