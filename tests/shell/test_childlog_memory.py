"""The child log keeps memory-failure lines of the whole run: vLLM's traceback after the
ValueError can push it out of the last 30 lines that ChildExited carries."""

from __future__ import annotations

import io
import time
from typing import Any

from tests.support import TIMEOUT_SCALE
from vllmwatch.core.events import ChildOutput
from vllmwatch.shell.childlog import ChildLog

FREE = ("ValueError: Free memory on device cuda:0 (2.6/121.63 GiB) on startup is less than "
        "desired GPU memory utilization (0.9, 109.47 GiB). Decrease GPU memory utilization or "
        "reduce GPU memory used by other processes.")


def test_memory_line_survives_a_long_traceback() -> None:
    text = "\n".join(["INFO Starting to load model", FREE]
                     + [f'  File "api_server.py", line {i}' for i in range(60)]) + "\n"
    posted: list[ChildOutput] = []

    def log(level: str, event: str, **fields: Any) -> None:
        pass

    cl = ChildLog(io.BytesIO(text.encode()), 4242, posted.append, log, forward=False)
    cl.start()
    deadline = time.monotonic() + 10 * TIMEOUT_SCALE
    while len(cl.last_lines) < 30 and time.monotonic() < deadline:
        cl.join(0.1)
    # the reader ends at the text's end: every line read, however loaded the box
    cl.join(60 * TIMEOUT_SCALE)
    assert not cl._reader.is_alive() and FREE not in cl.last_lines
    assert list(cl.memory_lines) == [FREE]
