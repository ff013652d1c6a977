"""The command line's words made hostile: no command, unknown options on either side of the
command, --config twice, words that are not UTF-8, a --url whose host cannot be named, a
locale that cannot print the records, and SIGINT in the middle. Each is a documented code and
a line that says what to give, never a traceback (docs/operations/exit-codes.md)."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import TIMEOUT_SCALE
from vllmwatch import cli
from vllmwatch.core import exitcodes

REPO = Path(__file__).resolve().parents[2]
RID = "20261201T000000Z-hang"
ODD = os.fsdecode(b"\xff\xfe")  # as Python hands a word that is not UTF-8 to argparse


def _config(tmp_path: Path, name: str = "v.toml", model: str = "/m") -> str:
    path = tmp_path / name
    path.write_text(f'[vllm]\nmodel = "{model}"\ncommand = ["/bin/true"]\n'
                    '[memory]\nunified = "false"\n[vllm.env]\nNOTE = "na\u00efve \u2603"\n')
    return str(path)


@pytest.fixture(autouse=True)
def _places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    monkeypatch.setenv("CACHE_DIRECTORY", str(tmp_path / "cache"))
    monkeypatch.delenv("VLLMWATCH_CONFIG", raising=False)


def _main(capsys: pytest.CaptureFixture[str], *words: str) -> tuple[int, str, str]:
    code = cli.main(list(words))
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return code, out.out, out.err


@pytest.mark.parametrize("words", [[], ["-c", "/x.toml"], ["--config=/x.toml"]])
def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                     words: list[str]) -> None:
    """It exited 78 (a config error: `RestartPreventExitStatus=`, "fix the file") with the
    whole help on stdout; a missing command is argparse's usage error, 2, as an unknown one."""
    code, out, err = _main(capsys, *words)
    assert code == 2 and out == ""
    assert err.startswith("usage: vllmwatch") and "a command is required" in err
    assert "check" in err.splitlines()[-1]  # the commands are named


def test_the_docs_give_the_usage_code_for_no_command() -> None:
    page = (REPO / "docs" / "operations" / "exit-codes.md").read_text()
    assert "no command" in " ".join(page.split())


@pytest.mark.parametrize("words", [["--bogus", "status"], ["status", "--bogus"],
                                   ["-x", "incidents"], ["incidents", "-x"],
                                   ["print-command", "--json"], ["--url", "u", "status"]])
def test_an_unknown_option_before_or_after_the_command_is_2(
        capsys: pytest.CaptureFixture[str], words: list[str]) -> None:
    code, out, err = _main(capsys, *words)
    assert code == 2 and out == "" and "vllmwatch" in err and "error:" in err


@pytest.mark.parametrize("where", ["before", "after", "both sides"])
@pytest.mark.parametrize("command", ["print-command", "check", "status", "incidents",
                                     "prewarm"])
def test_config_given_twice_is_refused_not_the_last_one_taken(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, command: str) -> None:
    """`-c a.toml check -c b.toml` checked b.toml alone, and said nothing of a.toml."""
    first, second = _config(tmp_path, "a.toml"), _config(tmp_path, "b.toml")
    words = {"before": ["-c", first, "-c", second, command],
             "after": [command, "-c", first, "--config", second],
             "both sides": ["-c", first, command, "-c", second]}[where]
    code, out, err = _main(capsys, *words)
    assert code == 2 and out == "", err
    assert "--config" in err and first in err and second in err and "give one" in err


def test_the_same_config_twice_is_one(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = _config(tmp_path)
    code, out, _ = _main(capsys, "-c", path, "print-command", "-c", path)
    assert code == 0 and "/bin/true --model /m" in out


@pytest.mark.parametrize("words", [
    [ODD], ["--" + ODD], ["status", "--" + ODD], ["incidents", ODD],
    ["status", "-c", "/tmp/" + ODD], ["print-command", "-c", "/tmp/" + ODD],
    ["check", "--config-only", "-c", "/tmp/" + ODD], ["prewarm", "-c", "/tmp/" + ODD],
    ["incidents", "--dir", "/tmp/" + ODD], ["incidents", "show", ODD],
    ["status", "--url", f"http://{ODD}/"], ["status", "--url", f"http://h{ODD}:9101"],
    ["status", "--url", "http://a..b:9101"],
])
def test_words_that_are_not_utf8_are_a_line_and_a_documented_code(
        capsys: pytest.CaptureFixture[str], words: list[str]) -> None:
    code, out, err = _main(capsys, *words)
    assert code in (0, 1, 2, exitcodes.CONFIG), err  # 0: a --dir not made yet has no records
    assert (out + err).strip() and "unexpected error" not in err
    if words[0] == "status" and words[1] == "--url":  # a --url it cannot use: 2 (the docs)
        assert code == 2 and "bad --url" in err, err


@pytest.mark.parametrize("rid", ["..", "../x", "/etc/passwd", "x" * 10_000, ODD, "2026*",
                                 f"{RID}/../{RID}", f"{RID}/record.json",  # (ID/: its own)
                                 "-", " ", f"{RID}\n", "?"])
def test_a_hostile_incident_id_reads_nothing_outside_and_says_what_ids_look_like(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], rid: str) -> None:
    root = tmp_path / "incidents"
    (root / RID).mkdir(parents=True)
    (root / RID / "record.json").write_text(json.dumps({"id": RID, "reason": "hang"}))
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "record.json").write_text('{"id": "x", "reason": "OUTSIDE"}')
    code, out, err = _main(capsys, "incidents", "--dir", str(root), "show", rid)
    assert code == 2 and out == "" and "OUTSIDE" not in err and "root:" not in err
    assert "an incident id looks like" in err, err
    assert len(err) < 600 and len(err.splitlines()) == 1, err


def test_an_id_of_the_right_shape_that_is_absent_is_still_not_found(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "incidents" / RID).mkdir(parents=True)
    code, _, err = _main(capsys, "incidents", "--dir", str(tmp_path / "incidents"), "show",
                         "20991231T000000Z-crash")
    assert code == 1 and "no incident '20991231T000000Z-crash'" in err


def test_interrupted_by_any_command_is_130_and_a_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_dispatch", interrupted)
    for command in ("status", "incidents", "print-command", "prewarm", "check"):
        code, out, err = _main(capsys, command, "-c", _config(tmp_path))
        assert code == 130 and out == "" and err == "vllmwatch: interrupted\n", (command, err)


@pytest.mark.parametrize("started_as", [
    "sys.argv[0] = '/usr/bin/vllmwatch'",  # the console script
    "sys.orig_argv = [sys.executable, '-m', 'vllmwatch', 'incidents']"])  # python -m vllmwatch
def test_sigint_before_main_handles_it_is_a_line_not_a_traceback(started_as: str) -> None:
    """Ctrl-C while the command still imports its modules (before main's handling)."""
    script = (f"import os, signal, sys\n{started_as}\n"
              "import vllmwatch\n"  # the package first, as the entry points import it
              "os.kill(os.getpid(), signal.SIGINT)\n"  # Ctrl-C while the rest imports
              "from vllmwatch.cli import main\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=60 * TIMEOUT_SCALE, check=False)
    assert out.stderr == "vllmwatch: interrupted\n" and out.stdout == "", out.stderr
    assert out.returncode in (130, -signal.SIGINT), out.returncode


def test_a_program_that_imports_vllmwatch_keeps_python_s_own_interrupt() -> None:
    """The hook is the command's only: a program or a test run importing the package keeps
    Python's traceback of a KeyboardInterrupt (its own code's, not vllmwatch's to hide)."""
    script = ("import os, signal, vllmwatch\n"
              "os.kill(os.getpid(), signal.SIGINT)\n")  # (raised as os.kill returns)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=60 * TIMEOUT_SCALE, check=False)
    assert "Traceback" in out.stderr and "KeyboardInterrupt" in out.stderr, out.stderr
    assert "vllmwatch: interrupted" not in out.stderr


def test_sigint_while_status_waits_for_an_answer(tmp_path: Path) -> None:
    """A listener that takes the connection and never answers: Ctrl-C in the 3 s wait."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    config = tmp_path / "s.toml"
    config.write_text(f'[vllm]\nmodel = "/m"\ncommand = ["/bin/true"]\n'
                      f'[status]\nlisten = "127.0.0.1:{port}"\n')
    env = {**os.environ, "STATE_DIRECTORY": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "vllmwatch", "status", "-c", str(config)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        ready, _, _ = select.select([server], [], [], 60 * TIMEOUT_SCALE)
        assert ready, "status never connected"
        conn, _ = server.accept()  # taken, never answered
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60 * TIMEOUT_SCALE)
        conn.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.close()
    assert proc.returncode == 130 and out == "" and err == "vllmwatch: interrupted\n", err


@pytest.mark.parametrize("words", [["incidents"], ["incidents", "show", RID],
                                   ["incidents", "--json"], ["print-command"],
                                   ["check", "--config-only"], ["status"],
                                   ["incidents", "show", "caf\u00e9"]])
def test_an_ascii_locale_prints_what_it_cannot_encode_escaped(
        tmp_path: Path, words: list[str]) -> None:
    """LC_ALL=C without Python's UTF-8 coercion: stdout and stderr are ASCII."""
    state = tmp_path / "state"
    (state / "incidents" / RID).mkdir(parents=True)
    (state / "incidents" / RID / "record.json").write_text(json.dumps(
        {"id": RID, "reason": "hang", "detail": "caf\u00e9 \u2603", "time_utc": "2026-12-01"}))
    env = {**os.environ, "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0",
           "PYTHONIOENCODING": "", "STATE_DIRECTORY": str(state),
           "CACHE_DIRECTORY": str(tmp_path / "cache"),
           "VLLMWATCH_CONFIG": _config(tmp_path, model="/m/caf\u00e9")}
    out = subprocess.run([sys.executable, "-m", "vllmwatch", *words], cwd=REPO, env=env,
                         capture_output=True, timeout=120 * TIMEOUT_SCALE, check=False)
    said = (out.stdout + out.stderr).decode("ascii")  # nothing but ASCII reached the streams
    assert "Traceback" not in said and "Error" not in said, said
    assert out.returncode in (0, 1, 2, 3), said
