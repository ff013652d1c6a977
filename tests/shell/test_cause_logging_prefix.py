"""vLLM writes VLLM_LOGGING_PREFIX before its process prefix, and with VLLM_LOGGING_COLOR=1
colours the prefix and the level even into a pipe (vLLM 0.32 logger.py _FORMAT,
logging_utils/formatter.py): the diagnosis read `(EngineCore_DP0 pid=8) ` only at a line's
start, so under either no ERROR line, exception line or exit noise was recognised, and a
record's cause fell back to whatever line it found."""

from __future__ import annotations

import pytest

from vllmwatch.incident import cause

CYAN, RESET, RED, END = "\x1b[0;36m", "\x1b[0;0m", "\x1b[31m", "\x1b[0m"
ERR = "(EngineCore_DP0 pid=8) ERROR 12-07 08:58:36 [core.py:710] EngineCore failed to start."
EXC = "(EngineCore_DP0 pid=8) torch.OutOfMemoryError: CUDA out of memory."
NOISE = ("(EngineCore_DP0 pid=8) Warning: WARNING: destroy_process_group() was not called "
         "before program exit")


@pytest.mark.parametrize("head", ["", "[node-a] ", "vllm | "])
def test_the_diagnosis_reads_a_line_behind_the_logging_prefix(head: str) -> None:
    assert cause.is_error(head + ERR)
    assert cause.is_error(head + EXC)
    assert cause.is_exit_noise(head + NOISE)
    assert cause.body(head + EXC) == "torch.OutOfMemoryError: CUDA out of memory."
    assert not cause.is_error(head + ERR.replace("ERROR", "INFO"))


def test_the_diagnosis_reads_a_coloured_line() -> None:
    line = (f"{CYAN}(EngineCore_DP0 pid=8){RESET} {RED}ERROR{END} 12-07 08:58:36 "
            "[core.py:710] EngineCore failed to start.")
    assert cause.is_error(line)
    assert cause.body(f"{CYAN}(EngineCore_DP0 pid=8){RESET} x") == "x"


def test_a_line_without_a_process_prefix_is_read_whole() -> None:
    assert cause.body("torch.OutOfMemoryError: x") == "torch.OutOfMemoryError: x"
    assert cause.body("[rank0]: NCCL error") == "NCCL error"
