"""An unexpected exception in the daemon's start, before its loop runs, is the documented
crash (docs/operations/exit-codes.md): exit 70, one `daemon.crashed` with the traceback,
`daemon.exiting` and STOPPING=1, and what the start had made (the gate, the status server,
the effects) stopped: no listener, no process left. Before, it escaped as a raw traceback
with exit 1 and nothing said, which systemd restarted every RestartSec."""

from __future__ import annotations

from pathlib import Path

from tests.support import (
    FIRST_READY_S,
    PYTHON,
    TIMEOUT_SCALE,
    Daemon,
    base_config,
    free_port,
    merge,
    wait_for,
)
from vllmwatch.core import exitcodes
from vllmwatch.testing.daemon import run_argv
from vllmwatch.testing.ports import port_free

# `vllmwatch run` with the spare's plan raising: after the gate, the status server and the
# effects are up, before the loop (a stand-in for any bug of the start).
FAULTY = ("import sys\n"
          "from vllmwatch.shell import sparefx\n"
          "def boom(*_a, **_k):\n"
          "    raise RuntimeError('injected start-up fault')\n"
          "sparefx.make = boom\n"
          "from vllmwatch import cli\n"
          "sys.exit(cli.main(sys.argv[1:]))\n")


def test_a_start_up_exception_exits_70_with_one_crash_event_and_nothing_left(
        tmp_path: Path) -> None:
    gate_port, status_port = free_port(), free_port()
    cfg = merge(base_config(free_port(), status_port), {
        "gate": {"enabled": True, "listen": f"127.0.0.1:{gate_port}"},
        "spare": {"enabled": "auto"},
    })
    argv = [PYTHON, "-c", FAULTY, *run_argv(tmp_path / "vllmwatch.toml", ())]
    d = Daemon(tmp_path, cfg, argv=argv).start()
    try:
        assert d.wait_exit(60 * TIMEOUT_SCALE) == exitcodes.INTERNAL, d.dump()
        wait_for(lambda: d.named("daemon.exiting"), 5.0, "daemon.exiting")
        [crashed] = d.named("daemon.crashed")
        assert crashed["error"] == "RuntimeError: injected start-up fault"
        assert "Traceback (most recent call last)" in crashed["traceback"]
        assert "injected start-up fault" in crashed["traceback"]
        [exiting] = d.named("daemon.exiting")
        assert exiting["code"] == exitcodes.INTERNAL and exiting["reason"] == "internal"
        notify = d.notify
        assert notify is not None
        wait_for(lambda: notify.count("STOPPING=1") == 1, 5.0, "STOPPING=1")
        # No bare traceback on stderr beside the crash event.
        assert not [line for line in d.raw if "Traceback" in line], d.raw
        assert not d.named("child.started")  # the loop never ran: nothing launched
        assert port_free(gate_port) and port_free(status_port)
    finally:
        d.close()


def test_a_model_config_json_with_nan_is_no_crash_of_the_start(tmp_path: Path) -> None:
    """The repro of the defect: `{"max_position_embeddings": NaN}` crashed the spare's plan
    (int(NaN)) before the loop ran. The figure is unknown now, as for an unreadable
    config.json, the plan says why, and the daemon serves."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": NaN}')
    cfg = merge(base_config(free_port(), free_port()), {
        "vllm": {"model": str(model)},
        "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}"},
        "spare": {"enabled": "auto"},
    })
    d = Daemon(tmp_path, cfg).start()
    try:
        d.wait_ready(FIRST_READY_S)
        assert not d.named("daemon.crashed") and not d.named("daemon.exiting")
        assert d.named("spare.plan")
    finally:
        d.close()
