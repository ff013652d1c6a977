"""vLLM said a signal vllmwatch did not send started its shutdown ("[shutdown] API server:
shutdown triggered"), and then it was killed by a signal: child.exited and the restart's
detail said "killed by SIGKILL (OOM killer? see `journalctl -k | grep -i oom`)" and nothing of
the stop, which sent the reader to the kernel log for what was most likely the stopper's own
SIGKILL after its grace (`kill` then `kill -9`, `timeout -k`, a container runtime)."""

from __future__ import annotations

import pytest

from vllmwatch.core.names import Reason
from vllmwatch.core.policy import exit_cause, explain_exit

TOLD = "[shutdown] API server: shutdown triggered"


@pytest.mark.parametrize("signame", ["SIGKILL", "SIGTERM", "SIGINT"])
def test_the_outside_stop_is_said_with_the_signal(signame: str) -> None:
    why = explain_exit(None, signame, False, told=TOLD)
    reason, detail = exit_cause(why, None, False, (), starting=False, told=TOLD)
    assert reason == Reason.CRASH
    assert detail.startswith(f"killed by {signame} after a SIGTERM or SIGINT vllmwatch did "
                             "not send"), detail
    assert TOLD in detail and "other supervisors" in detail
    assert ("OOM killer" in detail) == (signame == "SIGKILL")  # (still possible: said second)


def test_without_vllm_s_words_or_when_asked_the_kill_reads_as_before() -> None:
    assert explain_exit(None, "SIGKILL", False).startswith("killed by SIGKILL (OOM killer?")
    assert explain_exit(None, "SIGKILL", True, killed_by_us=True, told=TOLD) == \
        "killed by SIGKILL from vllmwatch (it did not exit within the grace)"
