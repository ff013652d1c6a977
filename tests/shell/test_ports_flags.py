"""One port-holder rule for `check` and `run`, check's view of its own running child, the
check package's import graph, and [vllm.args] against vLLM's own flag list."""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import TIMEOUT_SCALE, free_port, wait_for
from vllmwatch.check import host as check_host
from vllmwatch.check import vllm as check_vllm
from vllmwatch.check.base import FAIL, PASS, WARN, Context
from vllmwatch.config import vllmflags, vllminfo
from vllmwatch.config.schema import from_dict
from vllmwatch.shell import child, groupfile, ports

REPO = Path(__file__).resolve().parents[2]
VLLM = REPO / ".cache" / "vllm-venv" / "bin" / "vllm"


@pytest.mark.parametrize(("listener", "wanted", "blocks"), [
    ("127.0.0.1", "127.0.0.1", True), ("::1", "127.0.0.1", False),
    ("127.0.0.1", "::1", False), ("0.0.0.0", "127.0.0.1", True), ("::", "127.0.0.1", True),
    ("0.0.0.0", "::1", False), ("::ffff:127.0.0.1", "127.0.0.1", True),
    ("10.0.0.1", "127.0.0.1", False), ("127.0.0.1", "0.0.0.0", True),
    ("::1", "::", True), ("::1", "0.0.0.0", False),
])
def test_overlap_table(listener: str, wanted: str, blocks: bool) -> None:
    assert ports.overlaps(listener, wanted) is blocks


@pytest.fixture
def listener_on(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    family, address = request.param
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((address, 0))
    except OSError as exc:
        sock.close()
        pytest.skip(f"cannot bind {address}: {exc}")
    sock.listen()
    yield address, int(sock.getsockname()[1])
    sock.close()


@pytest.mark.parametrize(("listener_on", "host", "blocked"), [
    ((socket.AF_INET6, "::1"), "127.0.0.1", False),
    ((socket.AF_INET, "127.0.0.1"), "127.0.0.1", True),
    ((socket.AF_INET, "127.0.0.1"), "localhost", True),
    ((socket.AF_INET, "127.0.0.1"), "0.0.0.0", True),
    ((socket.AF_INET6, "::1"), "::1", True),
], indirect=["listener_on"])
def test_check_and_run_agree(listener_on: tuple[str, int], host: str, blocked: bool,
                             tmp_path: Path) -> None:
    _, port = listener_on
    run_says = child.port_holder(host, port, ignore=set())
    config = from_dict({"vllm": {"model": "/m", "host": host, "port": port}},
                       str(tmp_path / "c.toml"))
    check_says = check_host.check_port(Context(config))
    assert (run_says is not None) is blocked
    assert (check_says.status == FAIL) is blocked, check_says
    if blocked:
        assert f"pid {os.getpid()}" in run_says and f"pid {os.getpid()}" in check_says.detail  # type: ignore[operator]


def test_check_recognises_this_instances_own_child(tmp_path: Path) -> None:
    path = str(tmp_path / "c.toml")
    port = free_port()
    code = (f"import socket,time; s=socket.socket(); s.bind(('127.0.0.1', {port})); "
            # a lifetime, not a wait: its owner kills it
            "s.listen(); print('up', flush=True); time.sleep(300)")
    env = {**os.environ, child.MARKER: child.instance_id(path)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        config = from_dict({"vllm": {"model": "/m", "port": port}}, path)
        mine = check_host.check_port(Context(config))
        assert mine.status == PASS and "this instance's own vLLM" in mine.detail
        other = from_dict({"vllm": {"model": "/m", "port": port}}, str(tmp_path / "o.toml"))
        assert check_host.check_port(Context(other)).status == FAIL
    finally:
        proc.kill()
        proc.wait(timeout=10 * TIMEOUT_SCALE)


def test_check_modules_import_base_not_the_runner_and_no_function_level_imports() -> None:
    for path in (REPO / "vllmwatch" / "check").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "vllmwatch.check.runner":
                pytest.fail(f"{path.name} imports the runner")
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                        "vllmwatch.check"):
                    pytest.fail(f"{path.name}:{node.lineno} imports a check inside {fn.name}")
    for first in ("gpu", "model", "maxlen", "host", "vllm", "runner", "base"):
        out = subprocess.run([sys.executable, "-c", f"import vllmwatch.check.{first}"],
                             capture_output=True, text=True, timeout=60 * TIMEOUT_SCALE,
                             check=False)
        assert out.returncode == 0, out.stderr


FAKE = vllmflags.FlagSet("0.99.0", frozenset({"max-model-len", "enforce-eager",
                                              "no-enforce-eager", "trust-remote-code",
                                              "compilation-config", "seed", "hf-token"}),
                         frozenset({"enforce-eager", "no-enforce-eager", "trust-remote-code"}))


@pytest.mark.parametrize(("args", "extra", "words"), [
    ({"max-model-length": 5}, [], ["not a flag of vLLM 0.99.0", "did you mean max-model-len"]),
    ({"max_model_len": 5}, [], []),
    ({"enforce-eager": False}, [], []),
    ({"trust-remote-code": False}, [], ["no --no-trust-remote-code"]),
    ({"trust-remote-code": 1}, [], ["takes no value"]),
    ({"compilation-config.level": 3}, [], []),
    ({"disable-log-requests": True}, [], ["removed from vLLM 0.99.0"]),
    ({}, ["--sed", "1"], ["did you mean seed"]),
    ({}, ["--seed=1", "--max-model-len", "8"], []),
])
def test_validate_args_against_a_flag_set(args: dict[str, object], extra: list[str],
                                          words: list[str]) -> None:
    config = from_dict({"vllm": {"model": "/m", "args": args, "extra_args": extra}})
    problems = vllmflags.validate_args(config, FAKE)
    assert bool(problems) is bool(words), problems
    for word in words:
        assert word in problems[0].problem


def test_flag_cache_is_read_only_from_a_private_place(tmp_path: Path) -> None:
    command = [sys.executable]
    cache = tmp_path / "cache"
    assert vllmflags.known_flags(command, None, str(cache)) is None  # no vLLM: no question
    assert vllmflags.known_flags(command, "0.99.0", str(cache), ask=False) is None
    assert cache.is_dir() and cache.stat().st_mode & 0o777 == 0o700
    python = vllminfo.interpreter(command)
    import hashlib
    key = hashlib.sha256(f"0.99.0\0{python}".encode()).hexdigest()[:16]
    entry = cache / f"{key}.json"
    entry.write_text(json.dumps({"version": "0.99.0", "flags": ["seed"], "switches": []}))
    entry.chmod(0o600)
    got = vllmflags.known_flags(command, "0.99.0", str(cache), ask=False)
    assert got is not None and got.flags == {"seed"}
    entry.chmod(0o666)  # anyone could have written it: not believed
    assert vllmflags.known_flags(command, "0.99.0", str(cache), ask=False) is None


def test_check_item_warns_when_vllm_cannot_be_asked(tmp_path: Path) -> None:
    config = from_dict({"vllm": {"model": "/m", "command": [sys.executable, "-m", "vllm"]}})
    r = check_vllm.check_vllm_args(Context(config, flags_cache=str(tmp_path)))
    assert r.status == WARN and "not checked" in r.detail
    problems, why = vllmflags.preflight(config, {"HOME": str(tmp_path)}, None)
    assert problems == [] and why is not None and "not checked" in why


def vllm_config(args: dict[str, object]) -> object:
    if not VLLM.exists():
        pytest.skip(f"needs the real vLLM at {VLLM} (scripts/setup_vllm.sh)")
    return from_dict({"vllm": {"model": "/m", "command": [str(VLLM), "serve"], "args": args}})


@pytest.mark.e2e
def test_real_vllm_flags_typo_and_removed_flag(tmp_path: Path) -> None:
    config = vllm_config({"max-model-length": 4096, "disable-log-requests": True,
                          "enforce-eager": True, "max-num-seqs": 4})
    version = vllminfo.version(config.vllm.command)  # type: ignore[attr-defined]
    started = time.monotonic()
    r = check_vllm.check_vllm_args(Context(config, flags_cache=str(tmp_path)))  # type: ignore[arg-type]
    asked_s = time.monotonic() - started
    print(f"asked vLLM {version} for its flags in {asked_s:.1f}s")
    assert r.status == FAIL, r
    assert "did you mean max-model-len" in r.detail
    assert f"--disable-log-requests was removed from vLLM {version}" in r.detail
    assert "enforce-eager" not in r.detail and "max-num-seqs" not in r.detail
    started = time.monotonic()
    fast = check_vllm.check_vllm_args(Context(config, fast=True, flags_cache=str(tmp_path)))  # type: ignore[arg-type]
    assert fast.status == FAIL and time.monotonic() - started < asked_s / 2
    good = vllm_config({"max-model-len": 4096, "enforce-eager": True})
    assert check_vllm.check_vllm_args(Context(good, fast=True, flags_cache=str(tmp_path))  # type: ignore[arg-type]
                                      ).status == PASS


def test_daemon_refusal_uses_the_cache_only_and_never_blocks(tmp_path: Path) -> None:
    from vllmwatch.shell import versions

    command = [sys.executable]
    config = from_dict({"vllm": {"model": "/m", "command": command,
                                 "args": {"max-model-length": 5}},
                        "prewarm": {"cache_dir": str(tmp_path)}})
    events: list[str] = []
    started = time.monotonic()
    # Not cached: goes ahead at once (the background question fails: no vLLM here).
    assert versions.refusal(config, {}, "0.99.0", lambda lvl, ev, **kw: events.append(ev)) \
        is None
    assert time.monotonic() - started < 1.0
    wait_for(lambda: "vllm.flags_unknown" in events, 60, "the background question")
    cache = vllmflags.default_cache_dir(config, {})
    python = vllminfo.interpreter(command)
    import hashlib
    key = hashlib.sha256(f"0.99.0\0{python}".encode()).hexdigest()[:16]
    Path(cache, f"{key}.json").write_text(json.dumps(
        {"version": "0.99.0", "flags": ["max-model-len"], "switches": []}))
    why = versions.refusal(config, {}, "0.99.0", lambda *a, **k: None)
    assert why is not None and "did you mean max-model-len" in why


@pytest.mark.parametrize(("listen", "allow_remote", "status", "words"), [
    ("127.0.0.1:9101", False, PASS, ["127.0.0.1:9101"]),
    ("localhost:9101", False, PASS, [":9101"]),
    ("", False, WARN, ["vllmwatch status` will not work"]),
    ("no-such-host.invalid:9101", False, FAIL, ["cannot resolve"]),
])
def test_check_status_listen(listen: str, allow_remote: bool, status: str,
                             words: list[str]) -> None:
    config = from_dict({"vllm": {"model": "/m"},
                        "status": {"listen": listen, "allow_remote": allow_remote}})
    r = check_vllm.check_status_listen(Context(config))
    assert r.status == status, r
    for word in words:
        assert word in r.detail


def test_check_port_names_a_foreign_address_and_a_privileged_port(tmp_path: Path) -> None:
    config = from_dict({"vllm": {"model": "/m", "host": "192.0.2.77", "port": free_port()}})
    r = check_host.check_port(Context(config))
    assert r.status == FAIL and "not an address of this machine" in r.detail
    if os.geteuid() == 0:
        return  # root may bind any port; nothing more to show
    low = from_dict({"vllm": {"model": "/m", "port": 80}})
    r = check_host.check_port(Context(low))
    assert r.status == FAIL and ("CAP_NET_BIND_SERVICE" in r.detail or "in use" in r.detail)


@pytest.mark.parametrize("where,warned", [
    ({"args": {"disable-log-stats": True}}, True),
    ({"extra_args": ["--disable-log-stats"]}, True),
    ({"args": {"max-num-seqs": 4}, "extra_args": ["--seed", "1"]}, False),
    ({"args": {"seed": 1}}, False),
])
def test_check_warns_that_disable_log_stats_blinds_the_hang_verdicts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: dict[str, object],
        warned: bool) -> None:
    """--disable-log-stats leaves /metrics without vLLM's series: busy and hung look alike
    to the canary's verdict, and the stall rule never fires. `check` says so."""
    monkeypatch.setattr(check_vllm.vllminfo, "version", lambda _c: "0.32.0")
    monkeypatch.setattr(check_vllm.vllmflags, "known_flags", lambda *a, **k: vllmflags.FlagSet(
        "0.32.0", frozenset({"disable-log-stats", "seed", "max-num-seqs"}),
        frozenset({"disable-log-stats"})))
    config = from_dict({"vllm": {"model": "/m", **where}})
    r = check_vllm.check_vllm_args(Context(config, flags_cache=str(tmp_path)))
    assert (r.status, "disable-log-stats" in r.detail) == ((WARN, True) if warned
                                                            else (PASS, False)), r


@pytest.mark.parametrize("key", ["status.listen", "gate.listen"])
def test_check_says_who_holds_our_own_listeners(tmp_path: Path, key: str) -> None:
    """status.listen and gate.listen are bind-tested like vllm.port: held by another process,
    the daemon would run without its status endpoint or without the gate (every client
    failing): a FAIL naming the holder. Held by this instance's running vllmwatch (the pid in
    its instance lock): PASS; by another vllmwatch: a WARN (two instances on one port)."""
    port = free_port()
    path = str(tmp_path / "c.toml")

    def config(at: str = path) -> Context:
        listen = {"status": {"listen": f"127.0.0.1:{port}"}} if key == "status.listen" else \
            {"gate": {"enabled": True, "listen": f"127.0.0.1:{port}"}}
        state = tmp_path / "state"
        state.mkdir(mode=0o700, exist_ok=True)
        return Context(from_dict({"vllm": {"model": "/m", "port": free_port()}, **listen}, at),
                       env={"STATE_DIRECTORY": str(state)})

    def mine(ctx: Context) -> list[Any]:
        got = check_vllm.check_status_listen(ctx) if key == "status.listen" else \
            check_host.check_gate_listen(ctx)
        return [got] if not isinstance(got, list) else got

    [free] = mine(config())
    assert free.name == key and free.status == PASS and "is free" in free.detail, free
    with socket.socket() as sock:  # somebody else's listener: this test process
        sock.bind(("127.0.0.1", port))
        sock.listen()
        [taken] = mine(config())
        assert taken.status == FAIL and f"pid {os.getpid()}" in taken.detail, taken
        assert f"change {key}" in taken.detail
    code = (f"import socket,time; s=socket.socket(); s.bind(('127.0.0.1', {port})); "
            # a lifetime, not a wait: its owner kills it
            "s.listen(); print('up', flush=True); time.sleep(300)")
    daemon = subprocess.Popen(["bash", "-c", f'exec -a vllmwatch {sys.executable} -c "$0" run',
                               code], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert daemon.stdout is not None and daemon.stdout.readline() == b"up\n"
        ctx = config()
        lock = groupfile.lock_path(child.instance_id(path), ctx.env)
        assert lock is not None
        Path(lock).write_text(f"{daemon.pid}\n")
        os.chmod(lock, 0o600)
        [running] = mine(ctx)
        assert running.status == PASS and "this instance's running vllmwatch" in running.detail
        [other] = mine(config(str(tmp_path / "other.toml")))
        assert other.status == WARN and "two instances share it" in other.detail, other
    finally:
        daemon.kill()
        daemon.wait(timeout=10 * TIMEOUT_SCALE)
