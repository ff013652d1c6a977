"""What a hostile review of the CLI (2026-12-05) found `init` and the commands doing wrong.

- `--api-key $KEY` with KEY unset (`--api-key --port 8001`): vLLM refuses the line; init
  wrote a config that served with no key, and said vLLM had served without one.
- a key that starts with a dash (`secrets.token_urlsafe()`: one in 64) is a flag to argparse:
  vLLM refuses the line; init printed the key in clear as a stray word.
- `--api-key '-my key'` (a space): argparse takes it as the value; init dropped it ("empty").
- an env file that is not UTF-8, a key file behind a symlink loop: `check --config-only`
  (the first ExecReload=) passed them as a rotation in progress; every launch then failed.
- `print-command | head`, `> /dev/full`: a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.shell.test_check import write_config
from tests.shell.test_init_migration import run_init
from tests.support import TIMEOUT_SCALE
from vllmwatch.config.command import load_for_reload
from vllmwatch.config.schema import ConfigError

KEY = "-Q3vS3KRIT_abcdef"


@pytest.mark.parametrize("words", [
    ["--api-key", "--port", "8001"],  # $KEY unset
    ["--port", "8001", "--api-key"],  # at the end
    ["--api-key", KEY],  # a key that starts with a dash: argparse takes it for a flag
    ["--api-key", KEY, "--port", "8001"],
])
def test_an_api_key_flag_without_a_value_is_refused_and_nothing_is_written(
        tmp_path: Path, words: list[str]) -> None:
    out = tmp_path / "vllmwatch.toml"
    rc, stdout, stderr = run_init(["vllm", "serve", "/m", *words], out)
    assert rc != 0 and not out.exists(), stderr
    assert "`--api-key` has no value on the line" in stderr, stderr
    assert "S3KRIT" not in stdout + stderr  # a dash-led key is never shown
    assert "the word after `--api-key` (not shown: it may be the secret)" in stderr \
        or KEY not in words


@pytest.mark.parametrize("flag", ["--hf-token", "--api-key"])
def test_a_secret_that_starts_with_a_dash_is_never_printed(tmp_path: Path, flag: str) -> None:
    rc, stdout, stderr = run_init(["vllm", "serve", "/m", flag, KEY], tmp_path / "c.toml",
                                  stdout=True)
    assert rc != 0 and "S3KRIT" not in stdout + stderr, stdout + stderr
    assert f"the word after `{flag}` (not shown: it may be the secret)" in stderr, stderr


def test_a_key_with_a_space_is_a_value_as_argparse_reads_it(tmp_path: Path) -> None:
    _, stdout, stderr = run_init(["vllm", "serve", "/m", "--api-key", "-my key"],
                                  tmp_path / "c.toml", stdout=True)
    assert "api_key_file" in stdout and "is empty" not in stderr, stdout + stderr
    assert "-my key" not in stdout + stderr


def test_a_negative_number_stays_a_value(tmp_path: Path) -> None:
    _, stdout, stderr = run_init(["vllm", "serve", "/m", "--seed", "-1"], tmp_path / "c.toml",
                                  stdout=True)
    assert "seed = -1" in stdout and "follows no flag" not in stderr, stdout + stderr


@pytest.mark.parametrize("key,how", [("env_file", "not utf-8"), ("api_key_file", "not utf-8"),
                                     ("env_file", "loop"), ("api_key_file", "loop")])
def test_a_file_no_retry_can_read_fails_the_reload(tmp_path: Path, key: str, how: str) -> None:
    target = tmp_path / "secret-file"
    if how == "loop":
        (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
        (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
        target = tmp_path / "loop-a"
    else:
        target.write_bytes(b"HF_TOKEN=\xff\xfe\n" if key == "env_file" else b"\xff\xfekey\n")
    path = write_config(tmp_path, "some/model", vllm=f'{key} = "{target}"')
    with pytest.raises(ConfigError, match=key):
        load_for_reload(path)


def _print_command(tmp_path: Path, stdout: object) -> subprocess.CompletedProcess[str]:
    path = write_config(tmp_path, "some/model")
    return subprocess.run([sys.executable, "-m", "vllmwatch", "print-command", "-c", path],
                          stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=120 * TIMEOUT_SCALE, check=False)


def test_a_full_disk_under_stdout_is_a_line_not_a_traceback(tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this machine")
    with open("/dev/full", "w") as full:
        out = _print_command(tmp_path, full)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "vllmwatch: cannot write: No space left on device" in out.stderr, out.stderr


def test_a_reader_that_left_is_no_traceback(tmp_path: Path) -> None:
    path = write_config(tmp_path, "some/model")
    proc = subprocess.Popen([sys.executable, "-m", "vllmwatch", "print-command", "-c", path],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before anything is written (`| true`)
    _, err = proc.communicate(timeout=120 * TIMEOUT_SCALE)
    assert proc.returncode == 1 and "Traceback" not in err and "Exception" not in err, err


@pytest.mark.parametrize("words,key", [
    (["--help"], "vllm.args.help"),
    (["--por", "9000"], "vllm.args.por"),  # no flag list: an owned flag abbreviated
    (["--ho", "0.0.0.0"], "vllm.args.ho"),
])
def test_init_writes_nothing_a_reload_would_refuse(tmp_path: Path, words: list[str],
                                                   key: str) -> None:
    """init wrote these (exit 0) and `check --config-only`, the units' ExecReload=, then
    refused the file: every reload failed."""
    out = tmp_path / "vllmwatch.toml"
    rc, _, stderr = run_init(["vllm", "serve", "/m", *words], out)
    assert rc != 0 and not out.exists() and key in stderr, stderr


def test_served_model_names_dropped_are_an_error_said_aloud(tmp_path: Path) -> None:
    _, stdout, stderr = run_init(["vllm", "serve", "/m", "--served-model-name", "a", "b"],
                                  tmp_path / "c.toml", stdout=True)
    assert 'served_model_name = "a"' in stdout
    assert "error: --served-model-name gives 2 names" in stderr and "'b' will get 404" in stderr


def test_a_record_field_with_a_newline_adds_no_line_to_the_report() -> None:
    from vllmwatch.incident import report

    r = {"id": "20261202T060000Z-x\nforged", "time_utc": "2026-12-02T06:00:00Z\nreason: ok",
         "reason": "crash\nx", "tree": {"note": "alive", "processes": []},
         "stacks": {"methods": {}, "processes": []}, "output": []}
    head = report.render(r).splitlines()[1:3]  # (under "== reason and timeline ==")
    assert head[0] == "incident 20261202T060000Z-x\\nforged  2026-12-02T06:00:00Z\\nreason: ok"
    assert head[1].startswith("reason: crash\\nx: ")


def test_a_folder_named_for_the_key_file_is_said_as_a_folder(tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    folder.mkdir()
    rc, _, stderr = run_init(["vllm", "serve", "/m", "--api-key", "sk-abcdefgh12345"],
                             tmp_path / "c.toml", force=True, api_key_file=str(folder))
    assert rc != 0 and "it is a directory; name a file, not a folder" in stderr, stderr
    assert "-c" not in stderr.split("directory")[1].split("\n")[0]


@pytest.mark.parametrize("words,model,flag", [
    (["--max-model-len", "4096", "/m"], "/m", "max-model-len = 4096"),
    (["--gpu-memory-utilization", "0.9", "/m"], "/m", "gpu-memory-utilization = 0.9"),
    (["--tensor-parallel-size", "1", "/m", "--seed", "-1"], "/m", "seed = -1"),
    (["/m", "--cudagraph-capture-sizes", "1", "2", "4"], "/m", '"1", "2", "4"'),  # nargs="+"
])
def test_without_a_flag_list_a_number_is_one_flags_whole_value(
        tmp_path: Path, words: list[str], model: str, flag: str) -> None:
    """`--fast` with nothing cached: a model after a flag with a number was taken as the
    flag's second word ("no model"), though the line served it."""
    _, stdout, stderr = run_init(["vllm", "serve", *words], tmp_path / "c.toml", stdout=True)
    assert f'model = "{model}"' in stdout and flag in stdout, stdout + stderr
    assert "no model" not in stderr, stderr
