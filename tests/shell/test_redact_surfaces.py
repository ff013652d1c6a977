"""Surfaces a hostile review found outside the one redactor or printing a traceback: /metrics
labels (a model URL with a token), `vllmwatch status --json` (it printed the raw answer, not
the redacted document), the status CLI's own error lines (a --url with a password), and
`vllmwatch incidents` / `status` on records and answers no vllmwatch writes (nested too deep
for Python's recursion, a lone UTF-16 surrogate): one line each, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.exposition import choose_encoder

from vllmwatch import cli
from vllmwatch.config.redact import REDACT
from vllmwatch.status import cli as status_cli
from vllmwatch.status.metrics import build_registry, render
from vllmwatch.status.snapshot import Snapshot

MODEL = "https://bob:ModelUrlPw77@hub.example/tiny?token=ModelTok3nVal9"
SECRETS = ("ModelUrlPw77", "ModelTok3nVal9")


def test_metrics_labels_pass_the_redactor() -> None:
    body, _ = render(build_registry(lambda: Snapshot(state="ready", ready=True, model=MODEL)))
    text = body.decode()
    assert "vllmwatch_info" in text and not [s for s in SECRETS if s in text], text


def test_the_redactor_leaves_an_ordinary_exposition_as_it_is() -> None:
    encoder, _ = choose_encoder("")
    raw = encoder(build_registry(lambda: Snapshot(
        state="ready", ready=True, model="Qwen/Qwen3-8B", last_reason="crash",
        last_reason_detail="exit 1"))).decode()
    assert REDACT.text(raw) == raw


def _answer(**extra: object) -> str:
    return json.dumps({"state": "ready", "ready": True, "vllmwatch_version": "1",
                       "restarts_by_reason": {}, "last_reason": "crash", **extra})


def test_status_json_prints_the_redacted_document(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    body = _answer(last_error="boom --api-key sk-LeakedKey1234567890 password=hunter2xyz",
                   model=MODEL)
    monkeypatch.setattr(status_cli, "fetch", lambda _url: body)
    assert cli.main(["status", "--json", "--url", "http://127.0.0.1:9"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["state"] == "ready"
    for secret in (*SECRETS, "sk-LeakedKey1234567890", "hunter2xyz"):
        assert secret not in out, out


def test_a_status_answer_with_a_lone_surrogate_is_printed_escaped(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    body = _answer(last_reason_detail="x\ud800y").replace('"ready", "ready"',
                                                           '"READY\\ud800", "ready"')
    monkeypatch.setattr(status_cli, "fetch", lambda _url: body)
    for args in (["status"], ["status", "--json"]):
        assert cli.main([*args, "--url", "http://127.0.0.1:9"]) == 0
        got = capsys.readouterr()
        assert "Traceback" not in got.err and got.out, got


def test_the_status_clis_own_lines_pass_the_redactor(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    url = "http://admin:Hunt3rPassw0rd@127.0.0.1:1"
    assert cli.main(["status", "--url", url]) != 0
    got = capsys.readouterr()
    assert "Hunt3rPassw0rd" not in got.out + got.err and "127.0.0.1:1" in got.err, got


def _record(root: Path, rid: str, text: str) -> None:
    (root / rid).mkdir(parents=True)
    (root / rid / "record.json").write_text(text, encoding="utf-8")


@pytest.mark.parametrize("depth,listed", [(100_000, False), (700, True)])
def test_a_record_nested_too_deep_is_one_line_and_the_others_are_listed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], depth: int, listed: bool) -> None:
    _record(tmp_path, "20260101T000000Z-deep", '{"id": "x", "reason": "crash", "detail": '
            + "[" * depth + "]" * depth + "}")
    _record(tmp_path, "20260102T000000Z-crash", json.dumps(
        {"id": "20260102T000000Z-crash", "reason": "crash", "detail": "exit 1",
         "time_utc": "2026-01-02T00:00:00Z"}))
    cli.main(["incidents", "--dir", str(tmp_path)])
    got = capsys.readouterr()
    assert "20260102T000000Z-crash" in got.out and "Traceback" not in got.err, got
    for args in (["show", "20260101T000000Z-deep"], ["show", "20260101T000000Z-deep",
                                                      "--json"]):
        code = cli.main(["incidents", "--dir", str(tmp_path), *args])
        got = capsys.readouterr()
        assert "Traceback" not in got.err, got
        assert code == 0 or "nested too deeply" in got.err, (code, got)


def test_a_record_with_a_lone_surrogate_is_listed_and_shown_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rid = "20260101T000000Z-crash"
    _record(tmp_path, rid, f'{{"id": "{rid}", "reason": "crash", "detail": "d\\ud800", '
            '"time_utc": "\\ud800"}')
    for args in ([], ["show", rid], ["show", rid, "--json"]):
        cli.main(["incidents", "--dir", str(tmp_path), *args])
        got = capsys.readouterr()
        assert rid in got.out + got.err and "Traceback" not in got.err, (args, got)


@pytest.mark.parametrize("length", [40, 400])
def test_a_status_line_for_systemd_passes_the_redactor_short_or_long(length: int) -> None:
    """STATUS= (what `systemctl status` shows every local user) was redacted only when cut
    (over 200 characters)."""
    from vllmwatch.shell.notify import status_line

    text = "restarting: vLLM failed with api_key=Zq7Secret9Value " + "x" * length
    line = status_line(text)
    assert line.startswith("STATUS=") and "Zq7Secret9Value" not in line and "<redacted>" in line


def test_a_flag_value_from_the_env_file_is_hidden_wherever_vllm_echoes_it(
        tmp_path: Path) -> None:
    """vllm.env_file's flag values are secret (that is why they are there), but only those
    of secret-looking names were learnt: vLLM's "non-default args" line echoed the rest."""
    from vllmwatch.config.redact import Redactor
    from vllmwatch.config.schema import from_dict
    from vllmwatch.shell import childrun

    value = "https://collector.internal:4317/v1/Zq7tenantXy9"
    env = tmp_path / "vllm.env"
    env.write_text(f"VLLMWATCH_ARG_OTLP_TRACES_ENDPOINT={value}\n")
    env.chmod(0o600)
    config = from_dict({"vllm": {"model": "/m", "gpus": [], "env_file": str(env),
                                 "env": {"TMPDIR": str(tmp_path)}}})
    got = childrun.prepare(config, {"PATH": "/usr/bin:/bin"}, "0123456789abcdef", None, {},
                           lambda *a, **k: None)
    assert isinstance(got, childrun.Prepared), got
    line = f"non-default args: {{'otlp_traces_endpoint': '{value}'}}"
    assert value not in Redactor().text(line)
