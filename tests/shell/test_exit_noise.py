"""child.exited's last lines say why vLLM ended, not what every Python exit prints.

The demo on vLLM 0.32 (CPU), its EngineCore SIGKILLed: the API server logged "engine core
exited unexpectedly" and `EngineDeadError: EngineCore encountered an issue`, then uvicorn's
shutdown, nanobind's leak report (~35 lines, triton's bindings) and resource_tracker's
warning. child.exited's 5 last lines were all nanobind and resource_tracker: the person
reading the journal at 3 a.m. saw a "reference counting issue" and a URL. Those lines are now
kept from the last lines (the incident record's tail keeps every line).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from vllmwatch.incident.cause import is_exit_noise
from vllmwatch.shell.childlog import ChildLog

# Verbatim: the API server's output from its last requests to its exit (scripts/demo.sh,
# vLLM 0.32.0+cpu, `pkill -9 -f VLLM::EngineCore`), as child.line carried it.
TAIL = (Path(__file__).parent / "fixtures" / "vllm-0.32.0-engine-death-tail.txt"
        ).read_text().splitlines()
DEAD = ("(APIServer pid=19225) ERROR 12-07 08:58:36 [async_llm.py:906] vllm.v1.engine."
        "exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
        "for the root cause.")
# Verbatim from the H200 (vLLM 0.26.0, docs/gpu): an API server's exit.
H200_EXIT = [
    "(APIServer pid=2594) INFO:     Shutting down",
    "(APIServer pid=2594) INFO:     Waiting for application shutdown.",
    "(APIServer pid=2594) INFO:     Application shutdown complete.",
    "/usr/lib/python3.12/multiprocessing/resource_tracker.py:254: UserWarning: "
    "resource_tracker: There appear to be 1 leaked semaphore objects to clean up at shutdown",
    "  warnings.warn('resource_tracker: There appear to be %d '",
]
# torch's warning at a TP engine's exit (its form in torch 2.4 to 2.11)
TORCH_EXIT = ("[rank0]:[W1207 08:58:36.112233445 ProcessGroupNCCL.cpp:1496] Warning: WARNING: "
              "destroy_process_group() was not called before program exit, which can leak "
              "resources. For more info, please see https://pytorch.org/docs/stable/"
              "distributed.html#shutdown (function operator())")
# What vLLM says that is never noise, exits and shutdowns included.
TELLING = [
    DEAD,
    "(APIServer pid=19225) WARNING 12-07 08:58:36 [core_client.py:817] [shutdown] MPClient: "
    "engine core exited unexpectedly; starting cleanup",
    "(APIServer pid=19225) INFO 12-07 08:58:36 [launcher.py:254] [shutdown] API server: "
    "shutdown triggered",
    "INFO:     Started server process [19225]",
    "INFO:     Application startup complete.",
    'INFO:     127.0.0.1:54690 - "POST /v1/completions HTTP/1.1" 200 OK',
    "(EngineCore_DP0 pid=812) ERROR 12-02 06:00:01 [core.py:710] torch.OutOfMemoryError: CUDA "
    "out of memory. Tried to allocate 2.00 GiB",
    "Traceback (most recent call last):",
    "RuntimeError: nanobind: leaked 4 instances!",  # an exception quoting it is an error
    "(APIServer pid=1) INFO 12-07 08:58:36 [api_server.py:1] Shutting down",
    "ValueError: Free memory on device cuda:0 (2.6/121.63 GiB) on startup is less than desired",
    "Killed",
]


def _last_lines(lines: list[str]) -> list[str]:
    def log(level: str, event: str, **fields: Any) -> None:
        pass

    data = ("\n".join(lines) + "\n").encode()
    cl = ChildLog(io.BytesIO(data), 19225, lambda _ev: None, log, forward=False)
    cl.start()
    cl.join(60)  # the reader ends at the data's end
    assert not cl._reader.is_alive()
    assert list(cl.tail)[-len(lines):] == lines  # the record's tail keeps every line
    return list(cl.last_lines)


def test_the_engine_deaths_last_words_end_child_exiteds_lines() -> None:
    last = _last_lines(TAIL)
    assert last[-1] == DEAD, last
    five = last[-5:]  # what child.exited carries (core/machine.py)
    assert DEAD in five, five
    assert not any(is_exit_noise(line) for line in last), last


@pytest.mark.parametrize("line", [ln for ln in TAIL if "nanobind" in ln or " - " in ln[:3]
                                  or "resource_tracker" in ln] + H200_EXIT + [TORCH_EXIT])
def test_every_exits_own_lines_are_noise(line: str) -> None:
    assert is_exit_noise(line)


@pytest.mark.parametrize("line", TELLING)
def test_what_vllm_says_is_never_noise(line: str) -> None:
    assert not is_exit_noise(line)


def test_the_fixture_holds_the_noise_it_is_about() -> None:
    """The tail as vLLM printed it: without the rule, its last five lines were all noise."""
    noise = [ln for ln in TAIL if is_exit_noise(ln)]
    assert len(noise) >= 30 and all(is_exit_noise(ln) for ln in TAIL[-5:])
    kept = [ln for ln in TAIL if not is_exit_noise(ln)]
    assert kept[-1] == DEAD and len(kept) + len(noise) == len(TAIL)


def test_only_noise_leaves_no_last_lines_and_a_full_tail() -> None:
    assert _last_lines([*H200_EXIT, TORCH_EXIT]) == []
