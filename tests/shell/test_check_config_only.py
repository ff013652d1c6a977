"""`vllmwatch check --config-only`: the units' first ExecReload=, refusing what a SIGHUP would.

A reload must fail visibly: the check exits with the config exit code (so `systemctl reload`
fails and `systemctl status` shows it) for exactly the configs the daemon's reload refuses
(config/command.load_for_reload, shared by both), and says the running config is kept.
"""

from __future__ import annotations

import io
import json
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


def test_a_key_file_that_can_never_work_fails_a_briefly_missing_one_does_not(
        tmp_path: Path) -> None:
    as_dir = tmp_path / "key-dir"
    as_dir.mkdir()
    bad = write_config(tmp_path, "some/model", vllm=f'api_key_file = "{as_dir}"')
    assert _run(bad)[0] == exitcodes.CONFIG
    (tmp_path / "a").mkdir()
    rotating = write_config(tmp_path / "a", "some/model",
                            vllm=f'api_key_file = "{tmp_path / "not-yet"}"')
    assert _run(rotating)[0] == exitcodes.OK  # the daemon retries it (a key rotation)


def test_a_missing_or_odd_file_is_a_line_not_a_traceback(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    for path in (tmp_path / "missing.toml", tmp_path):
        assert cli.main(["check", "--config-only", "--config", str(path)]) == exitcodes.CONFIG
        out = capsys.readouterr()
        assert "FAIL  config" in out.out and "Traceback" not in out.out + out.err
