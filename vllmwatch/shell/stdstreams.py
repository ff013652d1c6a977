"""The three standard descriptors of a command, made safe before anything opens a file.

A descriptor closed by the caller (`vllmwatch status >&-`, `2>&-`, `<&-`) is free, and the
next file opened takes it: the config, a record, a socket would then sit where a child's
output or input goes. Python leaves sys.stdout (or stderr, stdin) None for it: `print` to it
does nothing, `print(file=sys.stderr)` with stderr None writes to stdout (print-command's
notes above its line to copy), and a flush was an AttributeError's traceback.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

_NAMES = ((0, "stdin"), (1, "stdout"), (2, "stderr"))


def take_closed() -> bool:
    """Put /dev/null on each standard descriptor that is closed, with a stream for it;
    whether stdout was closed (the command then refuses: its output would go nowhere)."""
    closed_out = sys.stdout is None
    for fd, name in _NAMES:
        if getattr(sys, name) is not None:
            continue
        _occupy(fd)
        stream: TextIO = open(os.devnull, "r" if fd == 0 else "w",  # noqa: SIM115
                              encoding="utf-8", errors="backslashreplace")
        setattr(sys, name, stream)
    return closed_out


def _occupy(fd: int) -> None:
    try:
        os.fstat(fd)
        return  # (something of ours took it since the start: left alone)
    except OSError:
        pass
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)
