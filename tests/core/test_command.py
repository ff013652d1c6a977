"""The vLLM command builder: flag translation, refused legacy flags, environment, secrets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vllmwatch.config.command import (
    REDACTED,
    CommandError,
    accepts_shutdown_timeout,
    args_to_argv,
    build,
    read_api_key,
    redact_argv,
)
from vllmwatch.config.schema import ConfigError, from_dict
from vllmwatch.core import exitcodes


def cfg(**vllm: Any) -> Any:
    return from_dict({"vllm": {"model": "/m", **vllm}})


def test_argv_layout_and_no_shell() -> None:
    cmd = build(cfg(served_model_name="qwen", port=8001), {})
    assert cmd.argv[:2] == ("vllm", "serve")
    assert cmd.argv[2:] == ("/m", "--served-model-name", "qwen", "--host",
                            "127.0.0.1", "--port", "8001")


@pytest.mark.parametrize(("command", "words"), [
    # `vllm serve` takes the model as its positional (vLLM 0.32 warns at every launch that
    # --model will be removed), whichever way the serve subcommand is reached ...
    (["vllm", "serve"], ["/m"]),
    (["/venv/bin/vllm", "serve"], ["/m"]),
    (["/venv/bin/python", "/venv/bin/vllm", "serve"], ["/m"]),
    (["python3", "-m", "vllm.entrypoints.cli.main", "serve"], ["/m"]),
    # ... the api_server module, a wrapper and the fake vLLM have no positional: --model.
    (["python3", "-m", "vllm.entrypoints.openai.api_server"], ["--model", "/m"]),
    (["python3", "-m", "vllmwatch.testing.fake_vllm", "serve"], ["--model", "/m"]),
    (["/usr/local/bin/run-vllm.sh"], ["--model", "/m"]),
])
def test_the_model_is_positional_only_for_vllm_serve(command: list[str],
                                                     words: list[str]) -> None:
    argv = build(cfg(command=command), {}).argv
    assert list(argv[len(command):len(command) + len(words)]) == words
    assert ("--model" in argv) == (words[0] == "--model")


def test_flag_translation() -> None:
    argv = args_to_argv({
        "enforce_eager": True, "enable-prefix-caching": False, "max-model-len": 32768,
        "gpu-memory-utilization": 0.9, "dtype": "bfloat16",
        "hf-overrides": {"rope_parameters": {"rope_type": "dynamic", "factor": 4.0}},
        "allowed-origins": ["a", "b"]})
    assert argv == [
        "--enforce-eager", "--no-enable-prefix-caching", "--max-model-len", "32768",
        "--gpu-memory-utilization", "0.9", "--dtype", "bfloat16",
        "--hf-overrides", '{"rope_parameters":{"rope_type":"dynamic","factor":4.0}}',
        "--allowed-origins", '["a","b"]']
    assert json.loads(argv[-3])["rope_parameters"]["factor"] == 4.0


def test_extra_args_verbatim_after_args() -> None:
    cmd = build(cfg(args={"dtype": "half"}, extra_args=["--seed", "1", "--trust-remote-code"]),
                {})
    assert cmd.argv[-5:] == ("--dtype", "half", "--seed", "1", "--trust-remote-code")


@pytest.mark.parametrize(("where", "value", "words"), [
    ("args", {"rope-scaling": {"type": "yarn"}}, ["removed", "hf-overrides", "rope_parameters"]),
    ("args", {"rope_theta": 1e6}, ["removed", "hf-overrides"]),
    ("args", {"enforce-eager": "False"}, ["boolean flag", "enforce-eager = false"]),
    ("args", {"kv-cache-dtype": "fp16"}, ["fp16 is not a choice", "auto"]),
    ("args", {"disable-logprobs-during-spec-decoding": True}, ["removed"]),
    ("args", {"device": "cuda"}, ["removed", "vllm.gpus"]),
    ("args", {"port": 9000}, ["set by vllmwatch", "vllm.port"]),
    ("args", {"disable-log-requests": True}, ["removed", "enable-log-requests"]),
    ("extra_args", ["--disable-log-requests"], ["removed"]),
    ("extra_args", ["--enforce-eager", "False"], ["boolean flag"]),
    ("extra_args", ["--enforce-eager=False"], ["boolean flag"]),
    ("extra_args", ["--rope-scaling", '{"type":"yarn"}'], ["removed"]),
    ("extra_args", ["--kv-cache-dtype", "fp16"], ["not accepted"]),
    ("extra_args", ["--device", "cpu"], ["removed"]),
    ("extra_args", ["--hf-overrides", '{"rope_parameters": {'], ["bad JSON"]),
    ("extra_args", ["--compilation-config={'level': 3}"], ["bad JSON"]),
    ("args", {"speculative-config": '{"method": ngram'}, ["bad JSON"]),
])
def test_known_broken_flags_are_refused_with_their_replacement(
        where: str, value: Any, words: list[str]) -> None:
    with pytest.raises(CommandError) as err:
        build(cfg(**{where: value}), {})
    for word in words:
        assert word in str(err.value)
    assert err.value.key.startswith("vllm.")


def test_fine_values_of_watched_flags_pass() -> None:
    cmd = build(cfg(args={"kv-cache-dtype": "fp8", "enforce-eager": False}), {})
    assert "--no-enforce-eager" in cmd.argv and "fp8" in cmd.argv


def test_environment_strips_systemd_variables_and_sets_gpus() -> None:
    base = {"PATH": "/usr/bin", "NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1",
            "WATCHDOG_PID": "5", "HOME": "/root"}
    cmd = build(cfg(gpus=[0, 1], env={"VLLM_LOGGING_LEVEL": "DEBUG"}), base)
    assert "NOTIFY_SOCKET" not in cmd.env and "WATCHDOG_USEC" not in cmd.env
    assert "WATCHDOG_PID" not in cmd.env
    assert cmd.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert cmd.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert cmd.env["VLLM_LOGGING_LEVEL"] == "DEBUG" and cmd.env["PATH"] == "/usr/bin"
    assert "CUDA_VISIBLE_DEVICES" not in build(cfg(), base).env


def test_api_key_goes_through_env_never_argv_or_display() -> None:
    cmd = build(cfg(), {}, api_key="sk-secret-123")
    assert cmd.env["VLLM_API_KEY"] == "sk-secret-123"
    assert all("sk-secret" not in a for a in cmd.argv)
    assert "sk-secret" not in cmd.display()
    assert f"VLLM_API_KEY={REDACTED}" in cmd.display()


def test_secret_looking_env_and_flags_are_redacted_in_display() -> None:
    for cmd in (build(cfg(env={"HF_TOKEN": "hf_abc"}), {}),
                build(cfg(extra_args=["--hf-token", "hf_abc"]), {})):
        assert "hf_abc" not in cmd.display()
    assert redact_argv(["--x-api-key=abc", "--token", "t", "--n", "1"]) == [
        f"--x-api-key={REDACTED}", "--token", REDACTED, "--n", "1"]


def test_shutdown_timeout_passed_only_to_versions_that_take_it() -> None:
    assert accepts_shutdown_timeout("0.18.0") and accepts_shutdown_timeout("0.32.0+cpu")
    assert not accepts_shutdown_timeout("0.11.2") and not accepts_shutdown_timeout(None)
    c = from_dict({"vllm": {"model": "/m"}, "restart": {"drain_timeout": "20s"}})
    assert build(c, {}, vllm_version="0.32.0").argv[-2:] == ("--shutdown-timeout", "20")
    assert "--shutdown-timeout" not in build(c, {}, vllm_version="0.11.0").argv
    user = from_dict({"vllm": {"model": "/m", "args": {"shutdown-timeout": 5}}})
    assert build(user, {}, vllm_version="0.32.0").argv.count("--shutdown-timeout") == 1


def test_print_command_reads_key_file_and_redacts(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-very-secret\n")
    conf = tmp_path / "c.toml"
    conf.write_text(f'[vllm]\nmodel = "/m"\napi_key_file = "{key}"\n[prewarm]\nenabled = false\n')
    out = subprocess.run([sys.executable, "-m", "vllmwatch", "print-command", "--config",
                          str(conf)], capture_output=True, text=True, check=True)
    assert "sk-very-secret" not in out.stdout
    assert f"VLLM_API_KEY={REDACTED}" in out.stdout
    assert "vllm serve /m --host" in out.stdout  # the positional model (issue 36.8)


def test_unreadable_key_file_is_a_config_error(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text(f'[vllm]\nmodel = "/m"\napi_key_file = "{tmp_path}/missing"\n')
    out = subprocess.run([sys.executable, "-m", "vllmwatch", "print-command", "--config",
                          str(conf)], capture_output=True, text=True, check=False)
    assert out.returncode == exitcodes.CONFIG
    assert "vllm.api_key_file" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(("where", "value", "variable"), [
    ("args", {"hf-token": "hf_secret1"}, "HF_TOKEN"),
    ("args", {"hf_token": "hf_secret1"}, "HF_TOKEN"),
    ("args", {"api-key": "hf_secret1"}, "VLLM_API_KEY"),
    ("extra_args", ["--hf-token", "hf_secret1"], "HF_TOKEN"),
    ("extra_args", ["--hf-token=hf_secret1"], "HF_TOKEN"),
    ("extra_args", ["--api-key", "hf_secret1", "--seed", "1"], "VLLM_API_KEY"),
])
def test_secret_flags_move_from_argv_to_the_environment(
        where: str, value: Any, variable: str) -> None:
    cmd = build(cfg(**{where: value}), {})
    assert cmd.env[variable] == "hf_secret1"
    assert not any("hf_secret1" in a for a in cmd.argv)
    assert "--hf-token" not in cmd.argv and "--api-key" not in cmd.argv
    assert "hf_secret1" not in cmd.display()
    assert f"{variable}={REDACTED}" in cmd.display()


def test_bare_hf_token_flag_stays_and_redaction_spares_the_next_flag() -> None:
    cmd = build(cfg(extra_args=["--hf-token", "--seed", "1"]), {})
    assert "--hf-token" in cmd.argv and "HF_TOKEN" not in cmd.env
    assert redact_argv(["--hf-token", "--seed", "1"]) == ["--hf-token", "--seed", "1"]


def test_api_key_in_args_reaches_the_canary_and_conflicts_with_the_file(tmp_path: Path) -> None:
    assert read_api_key(cfg(args={"api-key": "k1"})) == "k1"
    (tmp_path / "k").write_text("k2")
    with pytest.raises(ConfigError, match="a second time"):
        read_api_key(cfg(args={"api-key": "k1"}, api_key_file=str(tmp_path / "k")))


@pytest.mark.parametrize("name", ["HF_TOKEN", "MY_API_KEY", "DB_PASSWORD", "AWS_SECRET_X",
                                  "HUGGING_FACE_HUB_TOKEN", "GCP_CREDENTIALS", "X_AUTH"])
def test_secret_like_env_names_are_redacted_in_display(name: str) -> None:
    cmd = build(cfg(env={name: "s3cr3t-value", "VLLM_LOGGING_LEVEL": "INFO"}), {})
    assert cmd.env[name] == "s3cr3t-value"
    assert "s3cr3t-value" not in cmd.display()
    assert "VLLM_LOGGING_LEVEL=INFO" in cmd.display()


def test_print_command_never_shows_secrets(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    for table in ('[vllm.env]\nHF_TOKEN = "hf_envsecret"\n',  # (both at once: refused)
                  '[vllm.args]\nhf-token = "hf_argsecret"\n'):
        conf.write_text(f'[vllm]\nmodel = "/m"\n{table}[prewarm]\nenabled = false\n')
        out = subprocess.run([sys.executable, "-m", "vllmwatch", "print-command", "--config",
                              str(conf)], capture_output=True, text=True, check=True)
        assert "hf_envsecret" not in out.stdout and "hf_argsecret" not in out.stdout
        assert "--hf-token" not in out.stdout


def test_a_guides_whole_set_of_bad_flags_is_refused_in_one_message() -> None:
    with pytest.raises(CommandError) as err:
        build(cfg(args={"rope-scaling": {"type": "yarn"}, "device": "cuda",
                        "enforce-eager": "False", "kv-cache-dtype": "fp16",
                        "disable-log-requests": True},
                  extra_args=["--disable-logprobs-during-spec-decoding", "--port", "1"]), {})
    keys = [p.key for p in err.value.problems]
    assert keys == ["vllm.args.rope-scaling", "vllm.args.device", "vllm.args.enforce-eager",
                    "vllm.args.kv-cache-dtype", "vllm.args.disable-log-requests",
                    "vllm.extra_args[0]", "vllm.extra_args[1]"]
    assert str(err.value).startswith("<config>: 7 problems:")


def test_every_variable_and_flag_vllmwatch_adds_is_in_the_one_injected_list() -> None:
    """`init --from-pid` leaves out of a supervised vLLM's config what vllmwatch added
    (issue 36.4); it reads config/launch.py's lists, so every launch path must stay in them."""
    from vllmwatch.config.launch import INJECTED_ENV, INJECTED_FLAGS
    from vllmwatch.prewarm.runner import CACHE_VARS, cache_env
    from vllmwatch.shell.incidents import with_hook

    c = from_dict({"vllm": {"model": "/m", "gpus": [0], "env": {"MINE": "1"}},
                   "prewarm": {"cache_dir": "/var/cache/vw"}})
    base = {"PATH": "/usr/bin", "HOME": "/root"}
    extra = {**cache_env(c, base), "TMPDIR": "/tmp/vllmwatch-x"}
    cmd = with_hook(build(c, base, api_key="k", vllm_version="0.32.0", extra_env=extra),
                    "/stacks")
    added = set(cmd.env) - set(base) - {"MINE"}
    # vllm.gpus and the key are the config's own settings (init maps them back).
    assert added - {"CUDA_VISIBLE_DEVICES", "VLLM_API_KEY"} <= INJECTED_ENV
    assert set(CACHE_VARS) <= INJECTED_ENV and "VLLMWATCH_INSTANCE" in INJECTED_ENV
    user = {a.lstrip("-") for a in build(c, base).argv if a.startswith("--")}
    ours = {a.lstrip("-") for a in build(c, base, vllm_version="0.32.0").argv
            if a.startswith("--")}
    assert ours - user <= INJECTED_FLAGS


@pytest.mark.parametrize("key,flag", [
    ("hf-overrides.rope_scaling.factor", "--hf-overrides.rope_scaling.factor"),
    ("hf_overrides.rope_scaling.factor", "--hf-overrides.rope_scaling.factor"),
    ("compilation_config.cudagraph_mode", "--compilation-config.cudagraph_mode"),
    ("compilation-config.pass_config.enable_fusion",
     "--compilation-config.pass_config.enable_fusion"),
    ("max_model_len", "--max-model-len"),
])
def test_a_dotted_flag_keeps_its_keys_as_vllm_reads_them(key: str, flag: str) -> None:
    """vLLM turns underscores into dashes before the first dot only: after it come the keys
    of the flag's JSON (`rope_scaling` of the model's config). Every underscore was turned,
    so `rope-scaling` reached the model's config, a key nothing reads; and `pass_config`
    read as a secret name (its value hidden, the flag moved off argv)."""
    from vllmwatch.config.flags import flag_name
    from vllmwatch.config.redact import is_secret_name

    assert flag_name(key) == flag[2:]
    assert args_to_argv({key: 7}, "x") == [flag, "7"]
    assert not is_secret_name(key)
    assert is_secret_name("hf-overrides.api_key") and is_secret_name("db.password")


@pytest.mark.parametrize("extra", [["--api-key", "--Zq7dashKey9"],
                                   ["--api-key", "--Zq7dashKey9", "--max-model-len", "64"],
                                   ["--max-model-len", "64", "--api-key"]])
def test_an_api_key_flag_without_its_value_is_refused_without_the_next_word(
        tmp_path: Path, extra: list[str]) -> None:
    """`--api-key --Zq7...` (a key that starts with --, as token_urlsafe() may give) passed
    `check`; vllmwatch read the flag as bare, left it and the key on vLLM's command line
    (print-command, child.started, `ps` showed the key) and vLLM refused every start. Now
    the config is refused, and the message names the place, never the word after it."""
    with pytest.raises(ConfigError) as err:
        build(cfg(extra_args=extra), {})
    said = str(err.value)
    assert "vllm.extra_args" in said and "--api-key has no value" in said
    assert "Zq7dashKey9" not in said
    assert build(cfg(extra_args=["--api-key=--Zq7dashKey9"]), {}).env["VLLM_API_KEY"] == \
        "--Zq7dashKey9"


@pytest.mark.parametrize(("line", "variable"), [
    ("VLLMWATCH_ARG_API_KEY=--Zq7dashKey9", "VLLM_API_KEY"),
    ("VLLMWATCH_ARG_HF_TOKEN=--hf7dashTok9", "HF_TOKEN"),
])
def test_a_secret_flag_of_the_env_file_whose_value_starts_with_dashes_moves_whole(
        tmp_path: Path, line: str, variable: str) -> None:
    """vllm.env_file's value is the rest of its line, so `VLLMWATCH_ARG_API_KEY=--Zq7...`
    (token_urlsafe() may start a key with --) is the key; but its flag and value were read
    as two argv words, the flag bare: the key stayed on vLLM's command line in clear (`ps`),
    vLLM refused every start (argparse: expected one argument), and the probes sent no key.
    It moves to the variable as any other value does."""
    value = line.partition("=")[2]
    env_file = tmp_path / "env"
    env_file.write_text(line + "\n")
    env_file.chmod(0o600)
    cmd = build(cfg(env_file=str(env_file)), {})
    assert cmd.env[variable] == value
    assert not any(value in word for word in cmd.argv), cmd.argv
    assert variable != "VLLM_API_KEY" or cmd.api_key == value
