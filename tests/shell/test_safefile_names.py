"""config/safefile: a name no file can have, or one the locale cannot encode, is a problem the
caller reads, never a reader thread's traceback. Under LC_ALL=C with Python's UTF-8 modes off
and a non-ASCII vllm.model, `check --fast` printed "Exception in thread vllmwatch-read" and
its max-model-len row said "check crashed"."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support import TIMEOUT_SCALE
from vllmwatch.config import safefile

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(threading, "excepthook",
                        lambda args: seen.append(f"{args.exc_type.__name__}: {args.exc_value}"))
    return seen


@pytest.mark.parametrize("name", ["a\x00b.json", "nul\x00"])
def test_a_name_no_file_can_have_is_a_problem(tmp_path: Path, thread_errors: list[str],
                                             name: str) -> None:
    with pytest.raises(safefile.FileProblem) as err:
        safefile.read_within(str(tmp_path / name), 1024, 10 * TIMEOUT_SCALE)
    assert not err.value.transient and "cannot be opened by that name" in str(err.value)
    assert thread_errors == []
    assert safefile.text_within(str(tmp_path / name), 1024) is None


def test_any_failure_of_the_reader_is_a_problem(tmp_path: Path, thread_errors: list[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> bytes:
        raise RuntimeError("a reader's own bug")

    monkeypatch.setattr(safefile, "read_bounded", broken)
    with pytest.raises(safefile.FileProblem, match="RuntimeError: a reader's own bug"):
        safefile.read_within(str(tmp_path / "x"), 1024, 10 * TIMEOUT_SCALE)
    assert thread_errors == []


def test_a_name_the_c_locale_cannot_encode(tmp_path: Path) -> None:
    folder = tmp_path / "mod\u00e8le"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    # the name as a config's text gives it (argv's bytes would round-trip: surrogateescape)
    code = ("import sys; from vllmwatch.config import safefile\n"
            "path = sys.argv[1] + '/mod\\u00e8le/config.json'\n"
            "print(safefile.text_within(path, 1024), sys.getfilesystemencoding())")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0",
           "PYTHONUTF8": "0"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO,
                         env=env, capture_output=True, text=True, errors="replace",
                         timeout=60 * TIMEOUT_SCALE, check=False)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
    if "ascii" not in out.stdout:
        pytest.skip(f"this Python's file-system encoding under LC_ALL=C is {out.stdout!r}")
    assert out.stdout.startswith("None "), out.stdout
