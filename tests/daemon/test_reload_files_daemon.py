"""A rotation rewrites the key file or vllm.env_file in place (same path, same config) and
sends SIGHUP: the serving engine relaunches, drained, with what the files say now. Before,
the config's text was all a reload compared: vLLM kept the old key until some other restart,
and clients that moved to the new key got 401. A SIGHUP with the files unchanged restarts
nothing."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support import TIMEOUT_SCALE, Daemon, base_config, free_port, merge

OLD, NEW = "sk-RotateOldKey13579x", "sk-RotateNewKey24680y"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    (tmp_path / "key").write_text(OLD + "\n")
    (tmp_path / "vllm.env").write_text("HF_TOKEN=hf_old_token_value\n")
    cfg = merge(base_config(free_port(), free_port()), {"vllm": {
        "api_key_file": str(tmp_path / "key"), "env_file": str(tmp_path / "vllm.env")}})
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", cfg)
    try:
        yield d.start()
    finally:
        d.close()


def _status(port: int, key: str) -> int:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", method="POST",
        data=json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 1}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=20 * TIMEOUT_SCALE) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _reload(d: Daemon) -> int:
    since = d.mark()
    d.signal(signal.SIGHUP)
    d.wait_event("config.reloaded", 10.0, since)
    return since


@pytest.mark.parametrize("rotate", ["key", "env_file"])
def test_a_file_rewritten_in_place_relaunches_with_it(daemon: Daemon, tmp_path: Path,
                                                      rotate: str) -> None:
    d = daemon
    first = d.wait_ready()
    assert _status(d.port, OLD) == 200
    since = _reload(d)  # nothing rewritten: nothing restarts
    assert d.named("config.reloaded", since)[0]["restart_needed"] is False
    if rotate == "key":
        (tmp_path / "key").write_text(NEW + "\n")
    else:
        (tmp_path / "vllm.env").write_text("HF_TOKEN=hf_new_token_value\n")
    since = _reload(d)
    assert d.named("config.reloaded", since)[0]["restart_needed"] is True
    begin = d.wait_event("restart.begin", 10.0, since, reason="reload")
    part = "the API key" if rotate == "key" else "vllm.env_file's contents"
    assert begin["detail"] == f"{part} changed", begin
    ready = d.wait_ready(20.0, since=d.events.index(begin))
    assert ready["pid"] != first["pid"]
    env = psutil.Process(ready["pid"]).environ()
    if rotate == "key":
        assert env["VLLM_API_KEY"] == NEW
        assert _status(d.port, NEW) == 200 and _status(d.port, OLD) == 401
    else:
        assert env["HF_TOKEN"] == "hf_new_token_value"
    # The secrets never reach the log, rotated or not.
    text = "\n".join(d.raw) + json.dumps(d.events)
    assert NEW not in text and OLD not in text and "hf_new_token_value" not in text
