"""READY=1 goes out only after /status and /readyz can say ready (the published snapshot):
a unit ordered After=vllmwatch, or a test, that asks the status endpoint the moment it hears
READY=1 must never get a 503 (seen as a flaky daemon test on a loaded machine)."""

from __future__ import annotations

from vllmwatch.config.schema import from_dict
from vllmwatch.core.state import S
from vllmwatch.testing.driver import Driver

CONFIG = from_dict({"vllm": {"model": "/m", "gpus": []}, "prewarm": {"enabled": False}})


def test_the_snapshot_says_ready_before_ready_1_is_sent() -> None:
    d = Driver(CONFIG)
    seen: list[bool] = []
    send = d.notifier.send

    def send_and_look(message: str) -> bool:
        if "READY=1" in message.splitlines():
            seen.append(d.fx.snapshot.ready)  # what a reader of /readyz would get now
        return send(message)

    d.notifier.send = send_and_look  # type: ignore[method-assign]
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    assert seen == [True]
