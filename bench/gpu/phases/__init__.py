"""Every GPU phase, registered here and nowhere else.

A phase is a function `(run: Run) -> None` in a module of this folder: it starts what it
measures, reports with `run.emit(phase, what, **fields)`, and ends every process it started
(GpuDaemon.stop / stop_and_check, run.sweep) before it returns, whatever happened; a phase
that raises is recorded as failed and the run goes on. Adding one is one new module and one
line in PHASES below (bench/gpu/README.md, "Adding a phase").

`auto` runs, in PHASES order, the phases marked auto that state.json does not list yet, while
each one's estimate (seconds, an upper bound) still fits in the time left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.gpu import models
from bench.gpu.phases import (
    caches,
    faults,
    hangs,
    incident,
    probes,
    recipe,
    shapes,
    spare,
    standby,
    standby2,
)
from bench.gpu.run import Run


@dataclass(frozen=True)
class Phase:
    name: str
    run: Callable[[Run], None]
    est: float  # upper estimate in seconds, for auto
    auto: bool = True  # part of `auto`


# Seen on the H200 (2026-11-30): probe 38, serve 73, watch 152, prewarm 234.
PHASES: tuple[Phase, ...] = (
    Phase("probe0", probes.probe0, 30, auto=False),
    Phase("probe", probes.probe, 60),
    Phase("serve", recipe.serve, 150, auto=False),
    Phase("watch", recipe.watch, 220, auto=False),
    Phase("prewarm", recipe.prewarm, 300, auto=False),
    Phase("biggen", models.biggen, 150, auto=False),
    Phase("big", recipe.big, 500, auto=False),
    Phase("matrix", faults.matrix, 400),
    Phase("faults", faults.faults, 300),
    Phase("tp2", faults.tp2, 200),
    Phase("pergpu", shapes.pergpu, 150),
    Phase("pair", shapes.pair, 320),
    Phase("tp2big", shapes.tp2big, 500),
    Phase("tp2api", shapes.tp2api, 350),
    Phase("tp2apikill", shapes.tp2apikill, 250),
    # Issue 28: the standby interpreter and EngineCore by fork (docs/GPU.md section 6).
    Phase("standby", standby.standby, 480, auto=False),
    Phase("standbyoff", standby.standbyoff, 420, auto=False),
    Phase("standbyapi2", standby.standbyapi2, 300, auto=False),
    Phase("hangstop", hangs.hangstop, 480),  # issue 24: SIGSTOP x5 at the shipped [probe]
    Phase("hangload", hangs.hangload, 460),  # issue 24: 64 clients x 2,000 tokens, 5 min
    Phase("incident", incident.incident, 260),
    # Issue 27 (2 x H200, not yet run): TP=2 with the standby on (then off), one per GPU.
    Phase("tp2standby", standby2.tp2standby, 570, auto=False),
    Phase("tp2standbyoff", standby2.tp2standbyoff, 420, auto=False),
    Phase("pairstandby", standby2.pairstandby, 400, auto=False),
    # Issue 33 (docs/GPU.md section 10): vLLM's start-up caches, plain restarts then faults.
    Phase("cachesplain", caches.cachesplain, 900, auto=False),  # resumes over 2 calls
    Phase("cacheson", caches.cacheson, 260, auto=False),
    Phase("cachesoff", caches.cachesoff, 260, auto=False),
    # Issue 33, second run (docs/GPU.md section 12): the cold reference and both caches'
    # writing start in the install call, then `drive cacheson cachesoff` in one call.
    Phase("cachesprep", caches.cachesprep, 260, auto=False),
    # Issue 34 (docs/GPU.md section 14): the sleeping spare behind the gate, faults under load.
    Phase("spare", spare.spare, 560, auto=False),
)
BY_NAME = {p.name: p for p in PHASES}
