"""Which interpreter runs `vllm.command`, and how its entry runs inside a standby.

A standby can only stand in for a Python program started directly: a console script with a
Python shebang (`vllm serve`), `python -m MODULE` or `python SCRIPT`. Anything else
(`bash -c`, `uv run`, `docker run`, a wrapper script) starts processes a standby cannot be,
so the standby is off and the reason says why.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

# pip writes this two-line sh trampoline instead of a shebang when the interpreter's path is
# longer than the kernel's limit: #!/bin/sh / '''exec' "/long/path/python" "$0" "$@"
_TRAMPOLINE = re.compile(rb"""^'''exec' "?([^"\s]+)"? "\$0" "\$@"\s*$""", re.MULTILINE)
_PYTHON = re.compile(r"^python[0-9.]*\Z")


@dataclass(frozen=True)
class Entry:
    """How to run the command in a standby: `interpreter`, then `target` as __main__.

    kind "path": run_path(target) (a console script or SCRIPT.py); "module": run_module.
    `skip`: how many leading argv items the entry stands for (the rest is sys.argv[1:]).
    """

    interpreter: str
    kind: str
    target: str
    skip: int

    def as_spec(self) -> dict[str, object]:
        """The entry part of the standby's JSON spec."""
        return {"kind": self.kind, "target": self.target, "skip": self.skip}


def resolve(command: Sequence[str], path: str | None) -> Entry | str:
    """The Entry for `command`, or why a standby cannot run it."""
    if not command:
        return "vllm.command is empty"
    exe = shutil.which(command[0], path=path)
    if exe is None:
        return f"{command[0]!r} is not found on PATH"
    exe = os.path.abspath(exe)
    if _PYTHON.match(os.path.basename(exe)):
        return _python_form(exe, command)
    python = _script_interpreter(exe)
    if not isinstance(python, tuple):
        return python
    return Entry(python[0], "path", exe, 1)


def _python_form(exe: str, command: Sequence[str]) -> Entry | str:
    if len(command) >= 3 and command[1] == "-m":
        return Entry(exe, "module", command[2], 3)
    # Any script file, not only *.py: the kernel's view of a console script is
    # `python /venv/bin/vllm serve` (what `init --from-pid` reads), and run_path runs it.
    if len(command) >= 2 and not command[1].startswith("-") and os.path.isfile(command[1]):
        return Entry(exe, "path", os.path.abspath(command[1]), 2)
    return (f"{os.path.basename(exe)} {' '.join(command[1:3])}: only `python -m MODULE` "
            "and `python SCRIPT` can run in a standby")


def _script_interpreter(exe: str) -> tuple[str] | str:
    """(python,) from a console script's shebang, or why it is not one."""
    try:
        with open(exe, "rb") as fh:
            head = fh.read(1024)
    except OSError as exc:
        return f"cannot read {exe}: {exc.strerror}"
    if not head.startswith(b"#!"):
        return f"{exe} is not a script (a binary or a wrapper): a standby needs Python"
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return f"{exe} has an empty shebang"
    if os.path.basename(words[0]) == "env" and len(words) == 2:
        found = shutil.which(words[1])
        words = [found] if found else words[1:]
    elif os.path.basename(words[0]) == "sh":
        match = _TRAMPOLINE.search(head)
        words = [match.group(1).decode("utf-8", "replace")] if match else words
    if len(words) != 1 or not _PYTHON.match(os.path.basename(words[0])):
        return (f"{exe} runs {' '.join(words)}, not a Python interpreter alone "
                "(a wrapper): a standby cannot stand in for it")
    if not os.access(words[0], os.X_OK):
        return f"the interpreter {words[0]} of {exe} is not executable"
    return (words[0],)
