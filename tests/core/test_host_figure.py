"""One host figure per memory rule, always the same kind (core/samples.host_figure).

PSS is read only every memory.pss_interval; the samples between carry RSS alone. The rules,
/status and /metrics use the last PSS carried forward, never the RSS of the samples between:
a PSS baseline would make every RSS sample look like growth (on unified memory the GPU rule
adds the host figure too), a false restart.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vllmwatch.config.schema import Config, from_dict
from vllmwatch.core import machine, restart
from vllmwatch.core.actions import Log
from vllmwatch.core.events import (
    CanaryResult,
    HealthResult,
    MemorySampled,
    Spawned,
    SweepDone,
    Tick,
)
from vllmwatch.core.samples import PSS, RSS, HostFigure, MemorySample, host_figure
from vllmwatch.core.state import S, WatchState
from vllmwatch.status import metrics
from vllmwatch.status.snapshot import Snapshot
from vllmwatch.status.statusline import snapshot_of

PSS_MIB, RSS_MIB, GPU_MIB = 264.0, 4091.0, 2048.0  # one tree, measured: PSS vs RSS
CONFIG = from_dict({
    "vllm": {"model": "/m"},
    "prewarm": {"enabled": False},
    "memory": {"gpu_growth_limit": 1000, "host_growth_limit": 1000, "baseline_delay": 0,
               "sustain": 2, "sample_interval": 1, "pss_interval": 4},
})


def _sample(with_pss: bool, source: str = "unified", pss: float = PSS_MIB) -> MemorySample:
    return MemorySample(source, (1,), GPU_MIB, host_rss_mib=RSS_MIB,
                        host_pss_mib=pss if with_pss else None)


def _ready(config: Config = CONFIG) -> tuple[WatchState, float]:
    """The pure core, stepped to READY by hand (tests/core/test_gpu_source.py too)."""
    now = 100.0
    s = machine.initial(config, now)
    for ev in (Tick(), SweepDone((), (), None), Spawned(4242), HealthResult(True, 200, 0.01,
               gen=1), CanaryResult(True, False, 0.01, gen=1)):
        now += 1.0
        s, _ = machine.step(s, ev, now)
    assert s.state == S.READY, s.state
    return s, now


# ---- the figure itself: a table -------------------------------------------------------------

def test_table_pss_is_carried_between_pss_samples() -> None:
    fig = host_figure(None, _sample(True, pss=300.0), 1.0, fixed=False)
    assert fig == HostFigure(PSS, 300.0, 1.0, fresh=True)
    fig = host_figure(fig, _sample(False), 2.0, fixed=True)  # RSS only: PSS carried
    assert fig == HostFigure(PSS, 300.0, 1.0, fresh=False)
    fig = host_figure(fig, _sample(True, pss=310.0), 5.0, fixed=True)
    assert fig == HostFigure(PSS, 310.0, 5.0, fresh=True)


def test_table_rss_only_while_pss_was_never_readable() -> None:
    fig = host_figure(None, _sample(False), 1.0, fixed=False)
    assert fig == HostFigure(RSS, RSS_MIB, 1.0, fresh=True)
    # before the rules' series starts a first PSS still takes over ...
    assert host_figure(fig, _sample(True), 2.0, fixed=False).kind == PSS
    # ... after it started, the kind stays: a series never mixes the two
    assert host_figure(fig, _sample(True), 2.0, fixed=True) == HostFigure(RSS, RSS_MIB, 2.0,
                                                                           fresh=True)


# ---- the rules, /status and /metrics over alternating samples ------------------------------

@settings(max_examples=60, deadline=None)
@given(pattern=st.lists(st.booleans(), min_size=4, max_size=30),
       source=st.sampled_from(["unified", "host", "nvml-process"]))
def test_alternating_samples_never_look_like_growth(pattern: list[bool], source: str) -> None:
    s, now = _ready()
    rule_gpu, rule_host, kinds = [], [], set()
    fired = []
    for with_pss in [True, *pattern]:  # the first sample after READY may or may not have PSS
        now += 1.0
        s, acts = machine.step(s, MemorySampled(_sample(with_pss, source), 0, gen=1), now)
        fired += [a for a in acts if isinstance(a, Log) and a.event == "memory.rule_fired"]
        mem = snapshot_of(s, now, 1.7e9, Snapshot(), None).memory
        rule_gpu.append(mem.gpu_rule_mib)
        rule_host.append(mem.host_rule_mib)
        kinds.add(mem.host_rule_source)
    assert not fired, fired[0].fields
    assert s.state == S.READY and restart.pending(s) is None
    assert set(rule_host) == {PSS_MIB} and kinds == {PSS}  # published: the rule's own figure
    want_gpu = {"unified": PSS_MIB + GPU_MIB, "host": PSS_MIB, "nvml-process": GPU_MIB}[source]
    assert set(rule_gpu) == {want_gpu}
    # what the rule would have seen sample by sample before: RSS on the samples between
    if source != "nvml-process" and not all(pattern):
        assert len({_sample(p, source).gpu_rule_mib for p in [True, *pattern]}) == 2


def test_real_growth_in_pss_still_fires() -> None:
    s, now = _ready()
    fired = []
    for i in range(12):
        now += 1.0
        grown = PSS_MIB + (1500.0 if i >= 2 else 0.0)
        sample = _sample(i % 4 == 0 or i >= 2, "unified", pss=grown)
        s, acts = machine.step(s, MemorySampled(sample, 0, gen=1), now)
        fired += [a.fields["rule"] for a in acts
                  if isinstance(a, Log) and a.event == "memory.rule_fired"]
    assert fired and fired[0] in ("gpu_growth_limit", "host_growth_limit")


def test_metrics_name_the_source_of_each_rule_figure() -> None:
    s, now = _ready()
    for with_pss in (True, False):
        now += 1.0
        s, _ = machine.step(s, MemorySampled(_sample(with_pss), 0, gen=1), now)
    snap = snapshot_of(s, now, 1.7e9, Snapshot(), None)
    assert snap.memory.host_rule_source == PSS and snap.memory.host_rule_age_s == 1.0
    assert snap.to_json()["memory"]["host_rule_source"] == "pss"
    body, _ = metrics.render(metrics.build_registry(lambda: snap))
    text = body.decode()
    assert 'vllmwatch_memory_rule_info{kind="host",source="pss"} 1.0' in text
    assert 'vllmwatch_memory_rule_info{kind="gpu",source="unified"} 1.0' in text
    host = [ln for ln in text.splitlines()
            if ln.startswith('vllmwatch_memory_rule_bytes{kind="host"}')]
    assert [float(ln.split()[-1]) for ln in host] == [PSS_MIB * 2**20]  # the carried PSS
