"""The core ends the start (StartOver, which stops the start guard), and the canary kind
`auto` found travels through the core (CanaryResult.kind -> ChildRun.canary.kind -> Probe)."""

from __future__ import annotations

import signal

from vllmwatch.config.schema import from_dict
from vllmwatch.core import machine
from vllmwatch.core.actions import Probe
from vllmwatch.core.events import CanaryResult, Tick
from vllmwatch.core.state import S
from vllmwatch.testing.driver import Driver, World

BASE = from_dict({
    "vllm": {"model": "/m", "gpus": []},
    "probe": {"interval": 5, "timeout": 2, "canary_interval": 60, "canary_timeout": 30},
    "restart": {"backoff_initial": 5, "backoff_jitter": 0.0},
    "prewarm": {"enabled": False},
})


def test_the_core_ends_the_start_at_ready_and_when_the_start_is_left() -> None:
    d = Driver(BASE, world=World())
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    assert d.fx.starts_over == ["ready"]
    d.signal(signal.SIGTERM)
    assert d.run_until(lambda: d.exit_code is not None, 120)
    assert d.fx.starts_over == ["ready"]  # a stop after READY: the start was over already
    d2 = Driver(BASE, world=World(canary_ok=False))
    assert d2.run_until(lambda: d2.state.state == S.STARTING, 30)
    d2.signal(signal.SIGTERM)
    assert d2.run_until(lambda: d2.exit_code is not None, 120)
    assert d2.fx.starts_over == ["stopping"]


def test_the_canary_kind_auto_found_lives_in_the_child_run() -> None:
    d = Driver(BASE, world=World())
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    c = d.state.child
    assert c is not None and c.canary.kind is None  # the World names no kind
    s, _ = machine.step(d.state, CanaryResult(True, False, 0.01, gen=c.gen, kind="embeddings"),
                        d.clock.now)
    s, _ = machine.step(s, CanaryResult(True, False, 0.01, gen=c.gen), d.clock.now)
    assert s.child is not None and s.child.canary.kind == "embeddings"  # kept, not reset
    s, acts = machine.step(s, Tick(), d.clock.now + BASE.probe.canary_interval + 1)
    probes = [a for a in acts if isinstance(a, Probe) and a.kind == "canary"]
    assert probes and probes[0].canary_kind == "embeddings"  # the next canary asks for it
