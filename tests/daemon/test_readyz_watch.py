"""The real daemon skips the deregister delay of a planned restart when nothing polls /readyz
(only a balancer that polls it can take vLLM out of rotation; issue 28), and keeps it for one
that does."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import TIMEOUT_SCALE, Daemon, base_config, free_port, merge


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    cfg = merge(base_config(free_port(), free_port()), {"drain": {"deregister_delay": "10s"}})
    d = Daemon(tmp_path, cfg).start()
    yield d
    d.close()


def _deregister_of_a_sigusr1(d: Daemon) -> float:
    d.wait_ready(20)
    mark = d.mark()
    d.signal(signal.SIGUSR1)
    return float(d.wait_event("drain.begin", 20, mark)["deregister_delay_s"])


def test_nothing_polls_readyz_so_a_planned_restart_does_not_wait(daemon: Daemon) -> None:
    assert _deregister_of_a_sigusr1(daemon) == 0.0


def test_a_balancer_polling_readyz_gets_the_delay(daemon: Daemon) -> None:
    stop = threading.Event()

    def balancer() -> None:
        while not stop.wait(0.5):
            with contextlib.suppress(OSError):  # URLError too: refused until it listens
                daemon.http_get("/readyz")

    poller = threading.Thread(target=balancer, daemon=True)
    poller.start()
    try:
        # Polls began with the status listener, before READY: the loop has one by then.
        assert _deregister_of_a_sigusr1(daemon) == 10.0
    finally:
        stop.set()
        poller.join(5 * TIMEOUT_SCALE)
