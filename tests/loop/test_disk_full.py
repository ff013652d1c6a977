"""A start that dies for a full disk under the caches (vLLM's compile writes there: Inductor's
C++ build, its caches, its temporary files): vLLM ends with "Engine core initialization
failed. See root cause above", the cause 60 lines up, out of the last lines ChildExited
carries. vllmwatch names it (child.disk_full, error: the line, where vLLM writes, what to
free) before the restarts, instead of a bare crash loop; the child log keeps that line
whatever follows it."""

from __future__ import annotations

import io
import time
from typing import Any

from tests.loop.test_startmem import CONFIG, TAIL, driver, fail_start
from tests.support import TIMEOUT_SCALE
from vllmwatch.config.schema import from_dict
from vllmwatch.core import reuse
from vllmwatch.core.events import ChildExited, ChildOutput, Tick
from vllmwatch.core.state import S
from vllmwatch.shell.childlog import ChildLog
from vllmwatch.testing.driver import Driver, World

# verbatim from vLLM 0.32 (CPU) with VLLM_CACHE_ROOT on a full 256 KiB tmpfs
LD = ("(EngineCore pid=32479) ERROR 12-06 05:43:05 [core.py:1510] /usr/bin/ld: final link "
      "failed: No space left on device")
END = ("RuntimeError: Engine core initialization failed. See root cause above. Failed core "
       "proc(s): {}")


def test_a_start_failed_by_a_full_disk_is_named_before_the_restart() -> None:
    d = driver()
    fail_start(d, memory_lines=(LD,), unified=False)
    [full] = d.events("child.disk_full")
    assert full["line"] == LD
    assert "~/.cache/vllm" in str(full["detail"]) and "free space" in str(full["hint"])
    assert d.events("restart.begin")  # still retried: the disk may be freed meanwhile
    assert [log.level for log in d.logs if log.event == "child.disk_full"] == ["error"]


def test_with_the_caches_placed_it_names_prewarm_cache_dir() -> None:
    config = from_dict({"vllm": {"model": "/m"}, "prewarm": {"cache_dir": "/srv/c"}})
    [full] = reuse.disk_full(config, ("INFO ok", "OSError: [Errno 28] No space left on device"))
    assert "prewarm.cache_dir (/srv/c, or systemd's CacheDirectory=)" in full.fields["detail"]


def test_an_ordinary_crash_says_nothing_of_a_disk() -> None:
    d = driver()
    fail_start(d, memory_lines=(), unified=False)
    assert not d.events("child.disk_full") and d.events("restart.begin")


def test_the_child_log_keeps_the_full_disk_line_past_a_long_traceback() -> None:
    text = "\n".join(["INFO Starting to load model", LD, *TAIL, *TAIL, END]) + "\n"
    posted: list[ChildOutput] = []

    def log(level: str, event: str, **fields: Any) -> None:
        pass

    cl = ChildLog(io.BytesIO(text.encode()), 4242, posted.append, log, forward=False)
    cl.start()
    deadline = time.monotonic() + 60 * TIMEOUT_SCALE
    while cl._reader.is_alive() and time.monotonic() < deadline:
        cl.join(0.1)
    assert not cl._reader.is_alive() and LD not in cl.last_lines
    assert list(cl.memory_lines) == [LD]


# an adapter's download that failed hours before, on a disk freed since; vLLM served on
OLD = ("(APIServer pid=7) ERROR 12-06 01:02:03 [serving.py:210] loading LoRA adapter sql: "
       "OSError: [Errno 28] No space left on device")
CUDA = "(EngineCore pid=9) RuntimeError: CUDA error: an illegal memory access was encountered"


def test_a_serving_vllms_crash_is_not_named_a_full_disk_for_a_line_of_hours_before() -> None:
    """The child log keeps full-disk lines of the whole run, and a crash of a vLLM that had
    served for hours (a CUDA error) was logged as child.disk_full, an error naming the disk,
    for a line long past: a serving vLLM's crash is judged by its last lines only."""
    assert not _crash_after_ready((CUDA,))
    assert _crash_after_ready((LD, CUDA))  # its own last lines still name it


def _crash_after_ready(last: tuple[str, ...]) -> list[dict[str, object]]:
    d = Driver(CONFIG, world=World())
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    pid = d.state.pid
    assert pid is not None
    d.world.child_alive = False
    d.fx.exited = ChildExited(pid, 1, None, last_lines=last, memory_lines=(OLD,))
    d.send(Tick())
    assert d.run_until(lambda: bool(d.events("restart.begin")), 60)
    return d.events("child.disk_full")
