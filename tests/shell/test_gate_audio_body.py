"""The gate reads a body as large as the audio vLLM takes (ChildCommand.audio_body).

vLLM 0.32 takes an audio file up to VLLM_MAX_AUDIO_CLIP_FILESIZE_MB (25 MiB by default,
envs.py; speech_to_text/base/utils.py reads a transcription's upload to it), and base64 audio
in a chat's input_audio up to 4/3 of that (multimodal/media/audio.py load_base64). The gate
refused every body over 16 MiB with 413: a 20 MiB transcription that vLLM answers directly
failed through the gate, and so did one within a cap the operator raised in [vllm.env]."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.shell.test_gate_http import WAIT, _answer, _gate
from tests.support import Daemon, base_config, free_port, merge
from vllmwatch.config import command
from vllmwatch.config.schema import from_dict
from vllmwatch.gate import guard
from vllmwatch.gate.runner import start_gate
from vllmwatch.status.snapshot import Snapshot

MIB = 2**20


@pytest.mark.parametrize(("env", "config_env", "mib"), [
    ({}, {}, 25), ({"VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": "40"}, {}, 40),
    ({"VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": "40"}, {"VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": "5"}, 5),
    ({"VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": "lots"}, {}, 25)])
def test_the_audio_body_follows_what_the_launched_vllm_reads(
        env: dict[str, str], config_env: dict[str, str], mib: int) -> None:
    """From whichever source sets the variable ([vllm.env] over the daemon's environment);
    one int() refuses fails vLLM's first audio request, and keeps the default's room."""
    config = from_dict({"vllm": {"model": "m", "env": config_env}})
    got = command.build(config, env).audio_body
    assert got == 4 * ((mib * MIB + 2) // 3) + MIB
    assert got >= mib * MIB * 4 // 3  # a whole file's base64 fits, with its JSON around it


def _post(port: int, size: int, expect: bool = False, body: bool = True) -> bytes:
    """Its answer; `body` False: the head alone (the gate refuses by its Content-Length)."""
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n"
            "Content-Type: multipart/form-data; boundary=b\r\nConnection: close\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall((head + ("Expect: 100-continue\r\n" if expect else "") + "\r\n").encode())
        if expect:  # the client uploads only after the gate's 100 Continue (curl's way)
            first = sock.recv(65536)
            if not first.startswith(b"HTTP/1.1 100") or not body:
                return first
        if body:
            sock.sendall(b"\0" * size)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    return got


@pytest.mark.parametrize("expect", [False, True])
def test_a_transcription_vllm_takes_passes_the_gate_and_one_over_its_cap_is_413(
        expect: bool) -> None:
    cmd = command.build(from_dict({"vllm": {"model": "m"}}), {})
    with _gate(_answer()) as (gate, srv):
        gate.forwarder.new_engine(7, None, cmd.audio_body)
        got = _post(gate.port, 20 * MIB, expect)  # a 20 MiB file: vLLM's default takes it
        assert got.startswith(b"HTTP/1.1 200"), got[:300]
        assert len(srv.got) == 1 and srv.got[0].endswith(b"\0" * 1024)
        over = cmd.audio_body + 1
        got = _post(gate.port, over, expect, body=False)
        assert got.startswith(b"HTTP/1.1 413"), got[:300]
        assert str(cmd.audio_body).encode() in got and b"VLLM_MAX_AUDIO_CLIP_FILESIZE_MB" in got
        assert len(srv.got) == 1 and gate.stats.too_large == 1


def test_the_cap_never_passes_half_of_what_the_gate_holds_at_once() -> None:
    """A cap of 1000 MiB would let one body exceed MAX_HELD: refused 503 'try again' for ever."""
    cmd = command.build(from_dict({"vllm": {"model": "m"}}),
                        {"VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": "1000"})
    with _gate(_answer()) as (gate, _srv):
        gate.forwarder.new_engine(7, None, cmd.audio_body)
        assert gate.guard is not None and gate.guard.max_body == guard.MAX_HELD // 2


def test_the_daemons_gate_takes_the_audio_cap_of_vllm_env(tmp_path: Path) -> None:
    """Through the daemon: [vllm.env] raises vLLM's audio cap to 40 MiB; a 40 MiB upload is
    met with 100 Continue (read, not refused), whether vLLM was launched yet or not (the
    fake's start waits for a file that never comes: the request would be held)."""
    cfg = merge(base_config(free_port(), free_port(),
                            ["--hold-start-until", str(tmp_path / "never")]), {
        "vllm": {"env": {"VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": "40"}},
        "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}"}})
    d = Daemon(tmp_path, cfg)
    try:
        d.start()
        d.wait_event("gate.listening", 30.0)
        port = int(cfg["gate"]["listen"].rsplit(":", 1)[1])
        assert _post(port, 40 * MIB, expect=True, body=False).startswith(b"HTTP/1.1 100"), "refused"
        d.wait_event("child.started", 30.0)
        assert _post(port, 40 * MIB, expect=True, body=False).startswith(b"HTTP/1.1 100"), "refused"
    finally:
        d.close()


def test_the_gate_reads_its_first_byte_under_the_cap_it_starts_with() -> None:
    """start_gate's `audio` is the body cap before the gate listens: the daemon set it after
    gate.listening, and a 40 MiB upload that came first got 413 (a loaded CI run)."""
    config = from_dict({"vllm": {"model": "m", "port": free_port()},
                        "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}"}})
    audio = command.build(config, {"VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": "40"}).audio_body
    gate = start_gate(config, lambda *_a, **_k: None, lambda: Snapshot(state="starting"),
                      audio=audio)
    assert gate is not None and gate.running
    try:
        assert gate.guard is not None and gate.guard.max_body == gate.forwarder.replay_body == audio
        assert _post(gate.port, 40 * MIB, expect=True, body=False).startswith(b"HTTP/1.1 100")
    finally:
        gate.stop()
