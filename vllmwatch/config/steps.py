"""Which step a reload's read is in, told to whoever bounds it (shell/reload.py).

A SIGHUP's read runs on a worker under a deadline; most of it is file reads (a hung network
mount is the thing to catch), but one step runs the vLLM command's interpreter for its
version, which a new venv on a cold page cache takes well past a file read's few seconds.
The read says when it enters each step, so that the deadline fits the step and a read past
it names the step that was slow. Unwatched (`check --config-only`), telling is a no-op.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

READ = "reading the config"
VERSION = "the vLLM version probe (running vllm.command's interpreter)"
PORTS = "looking up who holds the new config's addresses"

_WATCHER: ContextVar[Callable[[str], None] | None] = ContextVar("vllmwatch_reload_step",
                                                                 default=None)


@contextmanager
def watched(tell: Callable[[str], None]) -> Iterator[None]:
    """While inside, step(name) calls tell(name) (this thread's reads only)."""
    token = _WATCHER.set(tell)
    try:
        yield
    finally:
        _WATCHER.reset(token)


def step(name: str) -> None:
    """The read enters step `name` (one of the names above)."""
    tell = _WATCHER.get()
    if tell is not None:
        tell(name)
