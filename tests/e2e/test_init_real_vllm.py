"""End-to-end: from a hand-run real vLLM to the service (docs/operations/install.md "Moving from a
hand-run vLLM"). A real CPU vLLM is started by hand (`vllm serve ... --api-key ...`), `vllmwatch
init --from-pid` reads it through its EngineCore's pid and writes the config, the hand-run
vLLM is stopped, the key file is made as init says, and `vllmwatch run` with the written
config reaches READY serving the same model name on the same port."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.e2e_harness import SERVED_NAME, find_in_tree, group_leftovers, kill_all
from tests.support import TIMEOUT_SCALE, Daemon, free_port, port_free, wait_for

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.e2e
STARTUP = 300.0 / TIMEOUT_SCALE
KEY = "sk-e2e-init-0123456789"


def _models(port: int) -> list[str]:
    """The model names the server on port lists, [] while it is not up."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models",
                                 headers={"Authorization": f"Bearer {KEY}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            import json

            return [m["id"] for m in json.loads(resp.read())["data"]]
    except (OSError, urllib.error.URLError, ValueError, KeyError):
        return []


def _hand_run(venv: Path, model: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    argv = ["vllm", "serve", str(model), "--served-model-name", SERVED_NAME, "--host",
            "127.0.0.1", "--port", str(port), "--max-model-len", "2048", "--enforce-eager",
            "--dtype", "bfloat16", "--api-key", KEY]
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=str(log.parent))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _stop_daemon(daemon: Daemon) -> None:
    """SIGTERM -> exit 0, then nothing of its tree left (what is, is killed and fails)."""
    if daemon.proc is not None and daemon.proc.poll() is None:
        daemon.signal(signal.SIGTERM)
        assert daemon.proc.wait(60) == 0
    daemon.close(check=True)
    left = group_leftovers(daemon)
    kill_all(left)
    assert not left, left


def test_init_from_pid_then_run_serves_the_same(tmp_path: Path, vllm_venv: Path,
                                                tiny_model: Path, vllm_flags: Path) -> None:
    port = free_port()
    cache = tmp_path / "cache"
    import shutil

    shutil.copytree(vllm_flags, cache / f"vllm-flags-{os.geteuid()}", dirs_exist_ok=True)
    hand = _hand_run(vllm_venv, tiny_model, port, tmp_path / "vllm.log")
    try:
        wait_for(lambda: SERVED_NAME in _models(port), STARTUP, "the hand-run vLLM to serve",
                 poll=1.0)
        engine = find_in_tree(hand.pid, "VLLM::EngineCore")
        assert engine, "no EngineCore under the hand-run vLLM"
        config = tmp_path / "etc" / "vllmwatch.toml"
        init = subprocess.run(
            [sys.executable, "-m", "vllmwatch", "init", "--from-pid", str(engine[0].pid),
             "-c", str(config)], capture_output=True, text=True, timeout=300, check=False,
            env={**os.environ, "CACHE_DIRECTORY": str(cache)})
        shown = init.stdout + init.stderr
        assert init.returncode == 0, shown
        assert KEY not in shown and KEY not in config.read_text()
        assert f"{port} is in use" in init.stdout  # its check sees the hand-run vLLM
    finally:
        _stop(hand)
        kill_all(find_in_tree(hand.pid, "VLLM::"))
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    text = config.read_text()
    vllm = tomllib.loads(text)["vllm"]
    assert vllm["port"] == port and vllm["served_model_name"] == SERVED_NAME
    assert vllm["model"] == str(tiny_model)
    Path(vllm["api_key_file"]).write_text(KEY + "\n")  # the step init printed
    wait_for(lambda: port_free(port), 60, "the hand-run vLLM's port to be free", poll=0.2)
    # The harness's own sections beside init's [vllm] (status port, JSON logs, no prewarm).
    text += (f'\n[status]\nlisten = "127.0.0.1:{free_port()}"\n[log]\nformat = "json"\n'
             f'[prewarm]\nenabled = false\ncache_dir = "{cache}"\n')
    daemon = Daemon(tmp_path, tomllib.loads(text))
    daemon.write_config(text)
    try:
        daemon.start()
        daemon.wait_ready(STARTUP)
        assert _models(port) == [SERVED_NAME]
    finally:
        _stop_daemon(daemon)


def _listening(port: int) -> set[str]:
    """The addresses a TCP socket listens on at port (the hand-run and the supervised vLLM)."""
    import psutil

    return {c.laddr.ip for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}


@pytest.mark.timeout(1800)  # two real vLLM starts and two full checks on a shared 2-core box
def test_init_of_the_guides_line_then_check_and_run_serve_where_the_hand_run_did(
        tmp_path: Path, vllm_venv: Path, tiny_model: Path, vllm_flags: Path) -> None:
    """Issue 36's "done when": the guide's kind of line (no --host: every interface; a bare
    `vllm` found on PATH; an API key), `--device cpu` added by hand for this CPU box, `init
    -- LINE`, `check`, `run`: the same address and port, the model as `serve`'s positional
    (no `--model` warning from vLLM 0.32), and init printed the next steps."""
    port = free_port()
    cache = tmp_path / "cache"
    import shutil

    shutil.copytree(vllm_flags, cache / f"vllm-flags-{os.geteuid()}", dirs_exist_ok=True)
    env = {"PATH": f"{vllm_venv / 'bin'}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    line = ["vllm", "serve", str(tiny_model), "--served-model-name", SERVED_NAME, "--port",
            str(port), "--max-model-len", "2048", "--enforce-eager", "--dtype", "bfloat16",
            "--api-key", KEY]
    with (tmp_path / "vllm.log").open("wb") as out:
        hand = subprocess.Popen(line, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    config = tmp_path / "etc" / "vllmwatch.toml"
    try:
        wait_for(lambda: SERVED_NAME in _models(port), STARTUP, "the hand-run vLLM to serve",
                 poll=1.0)
        hand_at = _listening(port)
        assert hand_at == {"0.0.0.0"}, hand_at  # vLLM's default: every interface
        words = ["HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "VLLM_CPU_KVCACHE_SPACE=1",
                 *line, "--device", "cpu"]
        init = subprocess.run([sys.executable, "-m", "vllmwatch", "init", "-c", str(config),
                               "--", *words], capture_output=True, text=True, timeout=600,
                              check=False, env={**os.environ, "CACHE_DIRECTORY": str(cache),
                                                "PATH": env["PATH"]})
        shown = init.stdout + init.stderr
        assert init.returncode == 0, shown
        assert KEY not in shown and KEY not in config.read_text()
        assert "clients keep port" in init.stderr and "every interface" in init.stderr
        assert f"sudo -u vllmwatch vllmwatch check --config {config}" in init.stdout
        assert "systemctl enable --now vllmwatch" in init.stdout
    finally:
        _stop(hand)
        kill_all(find_in_tree(hand.pid, "VLLM::"))
    vllm = tomllib.loads(config.read_text())["vllm"]
    assert vllm["host"] == "0.0.0.0" and vllm["port"] == port and vllm["gpus"] == []
    assert vllm["command"] == [str(vllm_venv / "bin" / "vllm"), "serve"]  # systemd's PATH
    assert Path(vllm["api_key_file"]).read_text().strip() == KEY  # written by init, 0600
    wait_for(lambda: port_free(port), 60, "the hand-run vLLM's port to be free", poll=0.2)
    check = subprocess.run([sys.executable, "-m", "vllmwatch", "check", "-c", str(config)],
                           capture_output=True, text=True, timeout=600, check=False,
                           env={**os.environ, "CACHE_DIRECTORY": str(cache)})
    assert "FAIL" not in check.stdout, check.stdout
    # The harness's own sections beside init's (status port, JSON logs with vLLM's lines).
    text = config.read_text() + (
        f'\n[status]\nlisten = "127.0.0.1:{free_port()}"\n[log]\nformat = "json"\n'
        f'child_lines = true\n[prewarm]\nenabled = false\ncache_dir = "{cache}"\n'
        '[startup]\ntimeout = "10m"\n')  # a start on this shared 2-core box: 1-4 min
    daemon = Daemon(tmp_path, tomllib.loads(text))
    daemon.write_config(text)
    try:
        daemon.start()
        daemon.wait_ready(2 * STARTUP)
        assert _models(port) == [SERVED_NAME]
        assert _listening(port) == hand_at
        started = daemon.named("child.started")
        shown = str(started[-1]["command"]) if started else ""
        # `vllm serve MODEL` (the path as shown: the redactor may hide a part of it)
        assert re.search(rf"/vllm'? serve '?\S*{tiny_model.name}'? --", shown), shown
        assert " --model " not in shown, shown
        lines = " ".join(str(e.get("text", "")) for e in daemon.named("child.line"))
        assert "Application startup complete" in lines  # vLLM's lines are here ...
        assert "the `--model` option" not in lines  # ... and its --model warning is not
    finally:
        _stop_daemon(daemon)


def test_vllms_own_flag_list_says_which_flags_take_several_words(vllm_venv: Path,
                                                                  vllm_flags: Path) -> None:
    """The probe asks the real vLLM's parser which flags take several words (nargs "+"):
    `--cudagraph-capture-sizes 1 2 4` reaches vLLM as words, a list for `--max-model-len`
    is refused before a launch (config/vllmflags.py)."""
    from vllmwatch.config import vllmflags, vllminfo

    command = [str(vllm_venv / "bin" / "vllm"), "serve"]
    got = vllmflags.known_flags(command, vllminfo.version(command), str(vllm_flags),
                                ask=False)
    assert got is not None and got.lists is not None, "the flag list was not cached"
    assert {"cudagraph-capture-sizes", "served-model-name"} <= got.lists
    assert not {"max-model-len", "tokenizer", "enforce-eager"} & got.lists


def test_vllms_own_flag_list_says_how_each_value_is_read(vllm_venv: Path,
                                                         vllm_flags: Path) -> None:
    """The probe records the reader of each flag of the real vLLM (int, float, its
    human_readable_int, ...): `max-num-seqs = "1k"` is refused before a launch, `32k` for
    --max-model-len passes (config/vllmflags.py, units.vllm_read)."""
    from vllmwatch.config import vllmflags, vllminfo

    command = [str(vllm_venv / "bin" / "vllm"), "serve"]
    got = vllmflags.known_flags(command, vllminfo.version(command), str(vllm_flags),
                                ask=False)
    assert got is not None and got.parsers is not None, "the flag list was not cached"
    assert {k: got.parsers.get(k) for k in ("max-num-seqs", "gpu-memory-utilization",
                                            "max-num-batched-tokens", "max-model-len",
                                            "moe-backend", "hf-token")} == {
        "max-num-seqs": "int", "gpu-memory-utilization": "float",
        "max-num-batched-tokens": "hr_int", "max-model-len": "hr_int_auto",
        "moe-backend": "fold", "hf-token": None}
    assert "48" not in (got.choices or {})["max-lora-rank"]


def test_vllms_own_flag_list_says_how_each_json_value_is_read(vllm_venv: Path,
                                                              vllm_flags: Path) -> None:
    """The probe records the real vLLM's JSON readers and a config class's keys: `--lora-modules
    foo`, `--compilation-config abc` and `{"level": 3}` are refused before a launch, as vLLM
    0.32's parser refuses them (config/flagvalues.py, units.vllm_read); `--speculative-config`,
    whose parser takes any JSON but whose field is a dict (`5` crashed each start), is read as
    a JSON object (jsonobj)."""
    from vllmwatch.config import vllmflags, vllminfo

    command = [str(vllm_venv / "bin" / "vllm"), "serve"]
    got = vllmflags.known_flags(command, vllminfo.version(command), str(vllm_flags),
                                ask=False)
    assert got is not None and got.complete and got.parsers is not None and got.fields
    assert {k: got.parsers.get(k) for k in ("compilation-config", "kv-transfer-config",
                                            "speculative-config", "hf-overrides",
                                            "lora-modules")} == {
        "compilation-config": "object", "kv-transfer-config": "object?",
        "speculative-config": "jsonobj?", "hf-overrides": "dict_or_str", "lora-modules": "lora?"}
    assert "mode" in got.fields["compilation-config"]
    assert "level" not in got.fields["compilation-config"]
    assert {"name", "path"} <= set(got.fields["lora-modules"])
    from vllmwatch.config.flagvalues import read_problem
    refused = read_problem("speculative-config", 5, "vllm.args.speculative-config", got)
    assert refused is not None and "JSON object" in str(refused)
    assert read_problem("speculative-config", '{"method": "ngram"}',
                        "vllm.args.speculative-config", got) is None
