"""The API key vLLM enforces is the one every vllmwatch client of it sends, wherever the
config gives it. The probes, canary, smoke check, adapters and the spare read only
vllm.api_key_file and [vllm.args] api-key, while the launch also passes a key from [vllm.env],
vllm.env_file, extra_args or vllmwatch's own environment: vLLM required that key, every
canary got 401 and vLLM was never READY (`check --config-only` passed)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from vllmwatch.config import command, redact
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.config.spare import SparePlan
from vllmwatch.shell import adapters as watchmod
from vllmwatch.shell import childrun
from vllmwatch.shell.adapters import AdapterWatch
from vllmwatch.shell.sparefx import Planner
from vllmwatch.testing.world import LogCapture

KEY = "k3yFromSomewhere42"
BASE_ENV = {"PATH": "/usr/bin:/bin"}


def _secret_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "secret"
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


# where -> (folder, key) -> (the [vllm] keys that give the key there, the daemon's environ)
SOURCES: dict[str, Any] = {
    "api_key_file": lambda t, k: ({"api_key_file": _secret_file(t, k + "\n")}, {}),
    "vllm.args": lambda t, k: ({"args": {"api-key": k}}, {}),
    "vllm.env": lambda t, k: ({"env": {"VLLM_API_KEY": k}}, {}),
    "env_file variable": lambda t, k: ({"env_file": _secret_file(t, f"VLLM_API_KEY={k}\n")},
                                       {}),
    "env_file flag": lambda t, k: ({"env_file": _secret_file(
        t, f"VLLMWATCH_ARG_API_KEY={k}\n")}, {}),
    "extra_args": lambda t, k: ({"extra_args": ["--api-key", k]}, {}),
    "extra_args inline": lambda t, k: ({"extra_args": [f"--api-key={k}"]}, {}),
    "the daemon's environment": lambda t, k: ({}, {"VLLM_API_KEY": k}),
}


def _vllms_key(cmd: command.ChildCommand) -> str | None:
    """The key vLLM enforces given this command: `args.api_key or VLLM_API_KEY`."""
    argv = list(cmd.argv)
    for i, word in enumerate(argv):
        if word == "--api-key":
            return argv[i + 1]
        if word.startswith("--api-key="):
            return word.partition("=")[2]
    return cmd.env.get("VLLM_API_KEY") or None


def _config(tmp_path: Path, where: str) -> tuple[Config, dict[str, str]]:
    keys, own = SOURCES[where](tmp_path, KEY)
    vllm = {"model": "/m", "gpus": [], **keys}
    vllm["env"] = {**vllm.get("env", {}), "TMPDIR": str(tmp_path)}  # none made by prepare
    return from_dict({"vllm": vllm}), {**BASE_ENV, **own}


@pytest.mark.parametrize("where", list(SOURCES))
def test_every_client_sends_the_key_vllm_enforces(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    monkeypatch.setattr(redact, "KNOWN", redact._Known())  # (each build learns the key)
    config, environ = _config(tmp_path, where)
    prepared = childrun.prepare(config, environ, "0123456789abcdef", None, {},
                                lambda *a, **k: None)
    assert isinstance(prepared, childrun.Prepared), prepared
    assert _vllms_key(prepared.cmd) == KEY
    # the launch's key: the probes, the canary, the smoke check and the incident record
    assert prepared.api_key == KEY
    assert command.effective_api_key(config, environ) == KEY
    # the spare's command: its canary and its digest
    planner = Planner(cast(Any, SimpleNamespace(uds_path="/nonexistent")), environ,
                      lambda *a, **k: None)
    spare = planner.command(config, SparePlan(on=True, reason="test"))
    assert _vllms_key(cast(Any, spare)) == KEY and spare.api_key == KEY
    # the adapters' requests
    sent: list[dict[str, str]] = []
    monkeypatch.setattr(watchmod.bounded_http, "request", lambda *a, headers, **k: (
        sent.append(headers), (200, b"{}"))[1])
    AdapterWatch(config, LogCapture(), environ=environ)._get(config, "/v1/models")
    assert sent == [{"Authorization": f"Bearer {KEY}"}]


@pytest.mark.parametrize("where", ["vllm.env", "env_file variable", "extra_args"])
def test_the_spares_digest_sees_a_new_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           where: str) -> None:
    """A reload that changes the key only there rebuilds the spare: its digest left
    VLLM_API_KEY out of the environment's part and read the key file's key alone."""
    from vllmwatch.shell.sparerun import digest

    monkeypatch.setattr(redact, "KNOWN", redact._Known())
    planner = Planner(cast(Any, SimpleNamespace(uds_path="/nonexistent")), BASE_ENV,
                      lambda *a, **k: None)
    parts = []
    for n, key in enumerate(("firstKey0123", "secondKey456")):
        (tmp_path / str(n)).mkdir()
        keys = SOURCES[where](tmp_path / str(n), key)[0]
        config = from_dict({"vllm": {"model": "/m", "gpus": [], **keys}})
        parts.append(dict(digest(planner.command(config, SparePlan(on=True, reason="t")))))
    assert parts[0]["the API key"] != parts[1]["the API key"]


def test_the_adapters_requests_send_the_running_engines_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapters' requests read the key file at each request (the next launch's key),
    while the probes send the running engine's: a key file rewritten for a rotation (before
    its SIGHUP relaunches) made every /v1/models read a 401 (the states froze) and the
    SIGHUP's retry of a failed adapter a 401 from the old engine, logged as vLLM refusing the
    adapter ("fix it")."""
    from vllmwatch.shell.effects import RealEffects

    key_file = _secret_file(tmp_path, "old-key-123456\n")
    config = from_dict({"vllm": {"model": "/m", "gpus": [], "api_key_file": key_file},
                        "adapters": [], "lora": {"live": True}})
    fx = SimpleNamespace(_adapters=None, log=LogCapture(), _environ=BASE_ENV,
                         _run=SimpleNamespace(api_key="old-key-123456"))
    RealEffects._watch_adapters(cast(Any, fx), config)
    Path(key_file).write_text("new-key-654321\n")  # rotated; the SIGHUP has not come yet
    sent: list[dict[str, str]] = []
    monkeypatch.setattr(watchmod.bounded_http, "request", lambda *a, headers, **k: (
        sent.append(headers), (200, b"{}"))[1])
    fx._adapters._get(config, "/v1/models")
    fx._run = None  # between a reap and the next launch: no engine, no key to send
    fx._adapters._get(config, "/v1/models")
    assert sent == [{"Authorization": "Bearer old-key-123456"}, {}]
