"""The STATUS= line keeps what an operator acts on (the exit and its code, the spare serving,
the restart's rung, the restart count and last reason) whatever the length of the free text
beside it (a gate's bind error, a refused reload's parser message, an exit's detail):
systemd keeps the last line after the process is gone, and a cut at STATUS_WIDTH took the
end of the line, where those were said."""

from __future__ import annotations

import dataclasses

import pytest

from vllmwatch.shell.notify import status_line
from vllmwatch.status.snapshot import Snapshot
from vllmwatch.status.statusline import summary

STATUS_WIDTH = 200  # statusline.STATUS_WIDTH, the cut status_line makes

GATE_DOWN = ("gate down: [Errno 98] error while attempting to bind on address ('0.0.0.0', "
             "8000): address already in use (another server holds gate.listen)",)
REFUSED = ("/etc/vllmwatch/vllmwatch.toml: line 12: [vllm] max_model_len = 'abc': expected an "
           "integer, got a string (the value must be a whole number of tokens, e.g. 32768)")


def _line(snap: Snapshot, down: tuple[str, ...]) -> str:
    return status_line(summary(snap, down))


@pytest.mark.parametrize("down", [(), GATE_DOWN, (*GATE_DOWN, "restart vllmwatch to apply "
                                                 "gate.listen, status.listen, log.format")])
def test_an_exit_for_a_cause_is_said_beside_a_gate_error_and_a_refused_reload(
        down: tuple[str, ...]) -> None:
    snap = Snapshot(state="stopping", reload_refused=REFUSED, exit_code=75,
                    exit_reason="crashloop", exit_detail="6 restarts in 10m (restart.window; "
                    "restart.max_restarts 5); the last: crash: CUDA error: an illegal memory "
                    "access was encountered", restart_phase="terminating",
                    restart_reason="crashloop", last_reason="crash")
    line = _line(snap, down)
    assert len(line) <= len("STATUS=") + STATUS_WIDTH
    assert "exiting 75: crashloop" in line
    assert "exit terminating for" in line  # the rung of the way out
    assert "last crash" in line
    assert "reload refused: /etc/vllmwatch/" in line  # shortened, still said
    if down:
        assert "gate down: [Errn" in line


def test_the_spare_serving_is_said_beside_a_gate_error_and_a_refused_reload() -> None:
    snap = Snapshot(state="starting", reload_refused=REFUSED, serving="spare",
                    spare={"for_s": 75.0}, restart_phase="launching", restart_reason="crash",
                    last_reason="crash")
    line = _line(snap, GATE_DOWN)
    assert "degraded: spare serving for" in line
    assert "restart launching for" in line
    assert "restarts 0 | last crash" in line


def test_a_line_that_fits_is_left_whole() -> None:
    snap = dataclasses.replace(Snapshot(state="ready", ready=True), last_reason="crash")
    assert _line(snap, ()) == "STATUS=" + summary(snap)
    assert "..." not in summary(snap, GATE_DOWN[:0])
