"""Every command's standard streams made hostile: a reader that left (`| head -0`), a closed
stdout (`>&-`), a full one (`> /dev/full`), a closed stderr (`2>&-`). Each ends in a documented
code with at most a line on stderr, never a traceback (docs/operations/exit-codes.md).

Before: `--help`, `--version` and the usage to a full disk exited 0 (argparse drops what it
cannot write); a closed stdout was an AttributeError traceback in every command (Python sets
sys.stdout to None) and `--help` moved its text to stderr; a closed stderr sent every error
and note to stdout, where print-command's one line to copy is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.shell.test_status_cli import serving
from tests.support import TIMEOUT_SCALE
from vllmwatch.status.snapshot import Snapshot

RID = "20261201T000000Z-hang"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A config, a state folder with one record and a /status that answers."""
    root = tmp_path_factory.mktemp("cli")
    config = root / "v.toml"
    config.write_text('[vllm]\nmodel = "/m"\ncommand = ["/bin/true"]\n'
                      '[memory]\nunified = "false"\n[prewarm]\nkernels = false\n')
    folder = root / "state" / "incidents" / RID
    folder.mkdir(parents=True)
    (folder / "record.json").write_text(json.dumps({"id": RID, "reason": "hang",
                                                    "detail": "d", "time_utc": "2026-12-01"}))
    body = json.dumps(Snapshot(state="ready", ready=True).to_json()).encode()

    with serving(body) as url:  # (test_status_cli's one-purpose /status)
        yield {"config": str(config), "state": str(root / "state"), "cache": str(root / "c"),
               "url": url}


# (words, the code when the reader left): check and status keep their verdict's code (a
# script's `vllmwatch check | head` still learns the result); any other command 1, as the
# GNU tools' SIGPIPE death fails a pipeline under `set -o pipefail`
COMMANDS: list[tuple[list[str], int]] = [
    (["--version"], 1), (["--help"], 1), (["check", "--help"], 1),
    (["status", "--url", "{url}"], 0), (["status", "--url", "{url}", "--json"], 0),
    (["incidents"], 1), (["incidents", "--json"], 1), (["incidents", "show", RID], 1),
    (["incidents", "show", RID, "--json"], 1), (["print-command"], 1),
    (["check", "--config-only"], 0), (["check", "--config-only", "--json"], 0),
    (["prewarm", "--json"], 1),
]


def _run(place: dict[str, str], words: list[str], how: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STATE_DIRECTORY": place["state"], "CACHE_DIRECTORY": place["cache"],
           "VLLMWATCH_CONFIG": place["config"]}
    argv = [sys.executable, "-m", "vllmwatch", *(w.format(**place) for w in words)]
    kw: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE}
    read_end = write_end = -1
    if how == "left":
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before a byte is written (`| true`)
        kw["stdout"] = write_end
    elif how == "closed":
        kw["preexec_fn"] = lambda: os.close(1)
    elif how == "full":
        kw["stdout"] = os.open("/dev/full", os.O_WRONLY)
        write_end = kw["stdout"]
    elif how == "no_stderr":
        kw = {"stdout": subprocess.PIPE, "preexec_fn": lambda: os.close(2)}
    try:
        return subprocess.run(argv, cwd=REPO, env=env, text=True, check=False,
                              timeout=120 * TIMEOUT_SCALE, **kw)
    finally:
        if write_end >= 0:
            os.close(write_end)


def _no_traceback(out: subprocess.CompletedProcess[str]) -> None:
    said = (out.stderr or "") + (out.stdout or "")
    assert "Traceback" not in said and "Exception ignored" not in said, said


@pytest.mark.parametrize("words,left_code", COMMANDS, ids=lambda v: " ".join(v)
                         if isinstance(v, list) else str(v))
def test_a_reader_that_left_ends_quietly_with_the_documented_code(
        place: dict[str, str], words: list[str], left_code: int) -> None:
    out = _run(place, words, "left")
    _no_traceback(out)
    assert out.returncode == left_code, out.stderr


@pytest.mark.parametrize("words", [w for w, _ in COMMANDS] + [[]],
                         ids=lambda v: " ".join(v) or "no command")
def test_a_closed_stdout_is_one_line_and_1(place: dict[str, str], words: list[str]) -> None:
    out = _run(place, words, "closed")
    _no_traceback(out)
    assert out.returncode == 1, out.stderr
    assert "vllmwatch: standard output is closed" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize("words", [w for w, _ in COMMANDS], ids=lambda v: " ".join(v))
def test_a_full_stdout_is_one_line_and_1(place: dict[str, str], words: list[str]) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this machine")
    out = _run(place, words, "full")
    _no_traceback(out)
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines()[-1] == \
        "vllmwatch: cannot write: No space left on device", out.stderr


@pytest.mark.parametrize("words,code,stdout", [
    (["print-command"], 0, "/bin/true --model /m"),
    (["incidents", "show", "20991231T000000Z-nope"], 1, ""),
    (["status", "--url", "http://127.0.0.1:1"], 3, ""),
    ([], 2, ""),
])
def test_a_closed_stderr_keeps_stdout_to_what_it_is_for(
        place: dict[str, str], words: list[str], code: int, stdout: str) -> None:
    """print(file=sys.stderr) with sys.stderr None prints to stdout: the notes landed above
    print-command's one line to copy, the errors where a script reads the output."""
    out = _run(place, words, "no_stderr")
    _no_traceback(out)
    assert out.returncode == code
    lines = out.stdout.splitlines()
    assert (lines == [] if not stdout else len(lines) == 1 and stdout in lines[0]), out.stdout


@pytest.mark.parametrize("where", ["before", "after", "--conf", "--co", "--config="])
def test_the_daemon_runs_with_a_closed_stdout(place: dict[str, str], where: str,
                                              tmp_path: Path) -> None:
    """`run` writes nothing to stdout (it logs): a closed one is no reason to stay down. A
    config it refuses shows it got past the streams: its config error (78), not the line.
    argparse takes a unique start of --config for it (`--conf PATH run`): PATH was taken for
    the command, and the daemon refused to start."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[vllm]\nmodel = 1\n")
    words = {"before": ["-c", str(bad), "run"], "after": ["run", "--config", str(bad)],
             "--config=": [f"--config={bad}", "run"]}.get(where, [where, str(bad), "run"])
    out = _run(place, words, "closed")
    _no_traceback(out)
    assert out.returncode == 78, out.stderr
    assert "standard output is closed" not in out.stderr and "config error" in out.stderr
