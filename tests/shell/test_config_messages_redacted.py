"""A config's own values come back in its error messages (a bad JSON flag, a URL that is not
an address, a flag given twice): every such message passes the one redactor, in `check`'s
rows (text and JSON), the CLI's config error, and `init`'s notes; and init keeps out of the
TOML every variable the redactor calls secret."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from tests.shell.test_check import write_config
from tests.shell.test_init import init
from vllmwatch import cli
from vllmwatch.check import runner
from vllmwatch.migrate import runner as init_runner

PW, KV = "statusPw9x", "kvS3cretPw"


def _bad(tmp_path: Path) -> str:
    """A config that does not load, whose errors quote two secrets: a password in a JSON
    flag (a stray comma makes it bad JSON) and one in status.listen's URL."""
    bad_json = '{"kv_connector": "X", "kv_connector_extra_config": {"password": "KV",}}'
    bad_json = bad_json.replace("KV", KV)
    path = Path(write_config(tmp_path, "some/model",
                             vllm=f"extra_args = ['--kv-transfer-config', '{bad_json}']"))
    path.write_text(path.read_text() + f'\n[status]\nlisten = "https://admin:{PW}@127.0.0.1:9101"\n')
    return str(path)


@pytest.mark.parametrize("as_json", [False, True])
def test_check_rows_never_show_a_secret_the_config_holds(tmp_path: Path, as_json: bool) -> None:
    out = io.StringIO()
    code = runner.config_only(_bad(tmp_path), as_json, out=out)
    text = out.getvalue()
    assert code != 0 and "<redacted>" in text, text
    assert PW not in text and KV not in text, text
    if as_json:
        assert all(PW not in r["detail"] for r in json.loads(text))


@pytest.mark.parametrize("fast", [False, True])
def test_checks_header_line_passes_the_redactor(tmp_path: Path, fast: bool) -> None:
    """Its rows did, the line naming the config did not: a path that carries a credential
    (a folder named as a variable) came out whole above the same path redacted in a row."""
    folder = tmp_path / f"token={PW}"
    folder.mkdir()
    path = str(folder / "vw.toml")
    out = io.StringIO()
    if fast:
        runner.config_only(path, False, out=out)
    else:
        runner.main(path, False, True, out=out, err=io.StringIO())
    assert "vllmwatch check: " in out.getvalue() and PW not in out.getvalue(), out.getvalue()


def test_the_clis_config_error_never_shows_a_secret(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["print-command", "--config", _bad(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert "config error" in err and PW not in err and KV not in err, err


def test_inits_given_twice_note_never_shows_the_earlier_value() -> None:
    _vllm, toml, _draft = init("vllm serve m --otlp-traces-endpoint https://bob:S3cretPw@c:4317 "
                               "--otlp-traces-endpoint http://localhost:4317")
    assert "given 2 times" in toml and "S3cretPw" not in toml, toml


@pytest.mark.parametrize("name", ["PGPASS", "DB_PWD", "SESSION_COOKIE", "AWS_SIG"])
def test_init_keeps_every_name_the_redactor_hides_out_of_the_toml(name: str,
                                                                   tmp_path: Path) -> None:
    value = "v4lueS3cret"
    _vllm, toml, draft = init(f"{name}={value} vllm serve m")
    assert value not in toml and draft.secret_env.get(name) == value, toml
    err = io.StringIO()
    req = init_runner.Request([f"{name}={value} vllm serve m"], None,
                              str(tmp_path / "v.toml"), stdout=True, fast=True)
    init_runner.main(req, os.environ, out=io.StringIO(), err=err)
    assert value not in err.getvalue(), err.getvalue()
