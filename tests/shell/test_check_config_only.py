"""`vllmwatch check --config-only`: the units' first ExecReload=, refusing what a SIGHUP would.

A reload must fail visibly: the check exits with the config exit code (so `systemctl reload`
fails and `systemctl status` shows it) for exactly the configs the daemon's reload refuses
(config/command.load_for_reload, shared by both), and says the running config is kept.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from tests.shell.test_check import write_config
from vllmwatch import cli
from vllmwatch.check import runner
from vllmwatch.config.command import load_for_reload
from vllmwatch.config.schema import ConfigError
from vllmwatch.core import exitcodes


def _run(path: str, as_json: bool = False) -> tuple[int, str]:
    out = io.StringIO()
    return runner.config_only(path, as_json, out=out), out.getvalue()


def test_a_good_config_passes(tmp_path: Path) -> None:
    path = write_config(tmp_path, "some/model")
    code, text = _run(path)
    assert code == exitcodes.OK
    assert "PASS  config" in text and "sha256 " in text and "a reload applies it" in text
    code, text = _run(path, as_json=True)
    assert json.loads(text)[0]["status"] == "PASS"


@pytest.mark.parametrize("mangle,named", [
    (lambda t: t + "\nthis is not toml [\n", "line"),
    (lambda t: t.replace("port = ", "port = 99999999 #"), "vllm.port"),
    (lambda t: t + "\n[probe]\ninterval = \"soon\"\n", "probe.interval"),
    (lambda t: t.replace("[vllm]", "[vllm]\nunknown_key = 1"), "unknown_key"),
])
def test_what_a_reload_refuses_fails_with_the_config_code(tmp_path: Path, mangle: object,
                                                          named: str) -> None:
    path = Path(write_config(tmp_path, "some/model"))
    path.write_text(mangle(path.read_text()))  # type: ignore[operator]
    with pytest.raises(ConfigError):
        load_for_reload(str(path))  # the daemon's reload refuses it too
    code, text = _run(str(path))
    assert code == exitcodes.CONFIG
    assert "FAIL  config" in text and named in text, text
    assert "a reload would keep the running config" in text
    assert "Traceback" not in text


# What a launch refuses (fatal) or cannot start, which loading alone let through: a reload
# that --config-only passed then stopped a healthy vLLM and the daemon exited 78 (or crashed,
# 70, on a value the command line cannot carry). Each class: more than one case.
@pytest.mark.parametrize("args,vllm,named", [
    ('device = "cuda"', "", "vllm.args.device"),  # removed from vLLM
    ("port = 9000", "", "vllm.args.port"),  # vllmwatch's own
    ("por = 9000", "", "vllm.args.por"),  # ... abbreviated: vLLM's parser takes prefixes
    ("", 'extra_args = ["--served=x"]', "vllm.extra_args[0]"),
    ('"api-k" = "sk-1"', "", "vllm.args.api-k"),  # a secret abbreviated would stay on argv
    ('kv-cache-dtype = "fp16"', "", "vllm.args.kv-cache-dtype"),  # not a choice
    ("", 'extra_args = ["--rope-scaling", "{}"]', "vllm.extra_args[0]"),
    ("", 'extra_args = ["--model=/other"]', "vllm.extra_args[0]"),
    ("", 'extra_args = ["", "--enforce-eager"]', "vllm.extra_args[0]"),  # an empty word
    ("max_model_len = 100\nmax-model-len = 200", "", "vllm.args.max-model-len"),  # twice
    ("max-model-len = 200", 'extra_args = ["--max-model-len", "100"]', "vllm.extra_args[0]"),
    ("max-model-len = 200", 'extra_args = ["--max_model_len=100"]', "vllm.extra_args[0]"),
    ("hf-overrides = { t = 1979-05-27 }", "", "hf-overrides.t"),  # a TOML date
    ("seed = 07:32:00", "", "seed"),  # a TOML time
    ("x = nan", "", "x: nan"),
    ('"max-model-len " = 5', "", "max-model-len "),  # not a flag's name
    ('tokenizer = "a\\u0000b"', "", "NUL"),
    # a key of [vllm] under [vllm.args] (TOML's tables): --api-key-file, and no key read
    ('api_key_file = "/etc/vllmwatch/api-key"', "", "vllm.args.api_key_file"),
    ('extra_args = ["--enforce-eager"]', "", "vllm.args.extra_args"),
    ('env-file = "/etc/vllmwatch/secrets.env"', "", "vllm.args.env-file"),
])
def test_flags_a_launch_refuses_fail_the_reload(tmp_path: Path, args: str, vllm: str,
                                                named: str) -> None:
    path = write_config(tmp_path, "some/model", args=args, vllm=vllm)
    with pytest.raises(ConfigError):
        load_for_reload(path)
    code, text = _run(path)
    assert code == exitcodes.CONFIG, text
    assert "FAIL  config" in text and named in text, text
    assert "Traceback" not in text


@pytest.mark.parametrize("env", ['"A=B" = "x"', '"1X" = "x"', 'C = "a\\u0000b"', '"" = "x"'])
def test_an_environment_a_process_cannot_have_fails_the_load(tmp_path: Path, env: str) -> None:
    path = Path(write_config(tmp_path, "some/model"))
    path.write_text(path.read_text().replace("[vllm.env]\n", f"[vllm.env]\n{env}\n"))
    code, text = _run(str(path))
    assert code == exitcodes.CONFIG and "vllm.env" in text and "Traceback" not in text, text


def test_a_key_file_that_can_never_work_or_is_missing_fails_an_empty_one_does_not(
        tmp_path: Path) -> None:
    """A missing file is a typo, not a rotation (a rotation renames a new file into place):
    the reload was applied and every relaunch then failed. An empty one is mid-rotation
    (an editor truncates, then writes): the daemon retries it."""
    as_dir = tmp_path / "key-dir"
    as_dir.mkdir()
    bad = write_config(tmp_path, "some/model", vllm=f'api_key_file = "{as_dir}"')
    assert _run(bad)[0] == exitcodes.CONFIG
    for name, key in (("a", "api_key_file"), ("b", "env_file")):
        (tmp_path / name).mkdir()
        missing = write_config(tmp_path / name, "some/model",
                               vllm=f'{key} = "{tmp_path / "typo"}"')
        code, text = _run(missing)
        assert code == exitcodes.CONFIG and f"vllm.{key}" in text and "not found" in text, text
    (tmp_path / "c").mkdir()
    (tmp_path / "empty").write_text("")
    rotating = write_config(tmp_path / "c", "some/model",
                            vllm=f'api_key_file = "{tmp_path / "empty"}"')
    assert _run(rotating)[0] == exitcodes.OK  # the daemon retries it (a key rotation)


def test_a_missing_or_odd_file_is_a_line_not_a_traceback(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    for path in (tmp_path / "missing.toml", tmp_path):
        assert cli.main(["check", "--config-only", "--config", str(path)]) == exitcodes.CONFIG
        out = capsys.readouterr()
        assert "FAIL  config" in out.out and "Traceback" not in out.out + out.err


@pytest.mark.parametrize("lines,named", [
    ("VLLMWATCH_ARG_PORT=9000\n", "VLLMWATCH_ARG_PORT"),  # a flag vllmwatch owns
    ("VLLMWATCH_ARG_DEVICE=cuda\n", "VLLMWATCH_ARG_DEVICE"),  # removed from vLLM
    ("this is not NAME=value\n", "line 2"),
    ("NOTIFY_SOCKET=/run/x\n", "NOTIFY_SOCKET"),  # a variable vllmwatch owns
    ("VLLM_SERVER_DEV_MODE=1\n", "VLLM_SERVER_DEV_MODE"),
    (None, "is a directory"),
])
def test_an_env_file_the_launch_refuses_fails_the_reload(tmp_path: Path, lines: str | None,
                                                        named: str) -> None:
    """vllm.env_file is read at each launch: a reload that took one the launch refuses
    stopped a healthy vLLM and then could not start it. Refused now, with its line's name
    (never its value)."""
    env_file = tmp_path / "secrets.env"
    if lines is None:
        env_file.mkdir()
    else:
        env_file.write_text("HF_TOKEN=hf_notshown0123456789abcdef\n" + lines)
    path = write_config(tmp_path, "some/model", vllm=f'env_file = "{env_file}"')
    with pytest.raises(ConfigError):
        load_for_reload(path)
    code, text = _run(path)
    assert code == exitcodes.CONFIG and named in text and "notshown" not in text, text
    env_file.unlink() if lines is not None else env_file.rmdir()
    env_file.write_text("HF_TOKEN=hf_notshown0123456789abcdef\nVLLMWATCH_ARG_SEED=7\n")
    assert _run(path)[0] == exitcodes.OK  # the operator's own: fine


@pytest.mark.parametrize("env,gpus,named", [
    ('NOTIFY_SOCKET = "/run/systemd/notify"', "", "vllm.env.NOTIFY_SOCKET"),
    ('WATCHDOG_USEC = "60000000"', "", "vllm.env.WATCHDOG_USEC"),
    ('VLLMWATCH_CONFIG = "/etc/other.toml"', "", "vllm.env.VLLMWATCH_CONFIG"),
    ('VLLM_SERVER_DEV_MODE = "1"', "", "vllm.env.VLLM_SERVER_DEV_MODE"),
    ('CUDA_VISIBLE_DEVICES = "3"', "gpus = [0]", "vllm.env.CUDA_VISIBLE_DEVICES"),
    ('CUDA_DEVICE_ORDER = "FASTEST_FIRST"', "gpus = [0]", "vllm.env.CUDA_DEVICE_ORDER"),
])
def test_a_variable_vllmwatch_owns_in_vllm_env_fails_the_load(
        tmp_path: Path, env: str, gpus: str, named: str) -> None:
    """systemd's variables, vllmwatch's own, vLLM's dev mode (its /sleep and /collective_rpc
    on the public port, open to every local user) and, with vllm.gpus set, the GPU choice
    its memory rules read: an override would run vLLM on GPU 3 while vllmwatch watches 0."""
    path = Path(write_config(tmp_path, "some/model"))
    text = path.read_text().replace("[vllm.env]\n", f"[vllm.env]\n{env}\n")
    path.write_text(text.replace("gpus = []\n", gpus + "\n") if gpus else text)
    code, out = _run(str(path))
    assert code == exitcodes.CONFIG and named in out and "Traceback" not in out, out
    if "CUDA" in env:  # vllm.gpus = "all": the operator's own choice (MIG UUIDs)
        path.write_text(text.replace("gpus = []\n", 'gpus = "all"\n'))
        assert _run(str(path))[0] == exitcodes.OK


def _program(tmp: Path, how: str) -> str:
    """A vllm.command program that cannot be started, each its own way."""
    script = tmp / "vllm"
    if how == "missing":
        return str(tmp / "no-such-venv" / "bin" / "vllm")
    if how == "not executable":
        script.write_text("#!/bin/sh\nexit 0\n")
        script.chmod(0o644)
    elif how == "interpreter missing":
        script.write_text(f"#!{tmp}/gone-venv/bin/python3\n")
        script.chmod(0o755)
    else:  # saved with Windows line endings: the kernel looks for "sh\r"
        script.write_text("#!/bin/sh\r\nexit 0\r\n")
        script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("how,said", [
    ("missing", "not found"), ("not executable", "not executable"),
    ("interpreter missing", "does not"), ("carriage return", "carriage return")])
def test_a_program_the_launch_cannot_start_fails_the_reload(tmp_path: Path, how: str,
                                                           said: str) -> None:
    """Taken by a reload, a typo in vllm.command drained the healthy vLLM, then the launch
    refused it as fatal: exit 78, the service down until someone edits the file."""
    path = Path(write_config(tmp_path, "some/model"))
    program = _program(tmp_path, how)
    path.write_text(path.read_text().replace(f'command = ["{sys.executable}", "-m", "vllm"]',
                                             f'command = ["{program}", "serve"]'))
    with pytest.raises(ConfigError, match=r"vllm\.command"):
        load_for_reload(str(path))
    code, text = _run(str(path))
    assert code == exitcodes.CONFIG and "vllm.command" in text and said in text, text
    assert "a reload would keep the running config" in text


def test_a_bare_program_name_is_left_to_the_launch(tmp_path: Path) -> None:
    """A bare name is looked up on vLLM's own PATH ([vllm.env] may set it): not judged."""
    path = Path(write_config(tmp_path, "some/model"))
    path.write_text(path.read_text().replace(f'command = ["{sys.executable}", "-m", "vllm"]',
                                             'command = ["vllm-not-on-this-path", "serve"]'))
    assert load_for_reload(str(path)).vllm.command[0] == "vllm-not-on-this-path"


@pytest.mark.parametrize("where", ["daemon", "vllm.env"])
def test_standalone_compile_off_with_the_artifact_on_fails_the_reload(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """The launch refuses it (fatal): vLLM asserts on it. The daemon's own environment
    (the unit's Environment=) counts as the launch's does."""
    if where == "daemon":
        monkeypatch.setenv("VLLM_USE_STANDALONE_COMPILE", "0")
    path = Path(write_config(tmp_path, "some/model",
                             extra='enabled = true\nmega_aot_artifact = "true"'))
    if where == "vllm.env":
        path.write_text(path.read_text().replace(
            "[vllm.env]\n", '[vllm.env]\nVLLM_USE_STANDALONE_COMPILE = "0"\n'))
    with pytest.raises(ConfigError, match="VLLM_USE_STANDALONE_COMPILE"):
        load_for_reload(str(path))
    code, text = _run(str(path))
    assert code == exitcodes.CONFIG and "VLLM_USE_STANDALONE_COMPILE=0" in text, text
