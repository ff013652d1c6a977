"""One GPU figure per leak series: a sample whose figure is made another way (its `source`)
never joins the series (core/leak.py "the GPU series' source").

The sampler falls back when a read fails: no per-process list -> the device's figure, no
device figure either -> the host's; on unified memory a failed per-process read leaves the
host part alone. Mixed into one series, a glitch at the baseline sample (the host's 264 MiB)
made the tree's steady 60000 MiB look like 59736 MiB of growth: a false restart.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.test_host_figure import _ready
from vllmwatch.config.schema import from_dict
from vllmwatch.core import machine, restart
from vllmwatch.core.actions import Action, Log
from vllmwatch.core.events import (
    MemorySampled,
)
from vllmwatch.core.samples import MemorySample, gpu_kind
from vllmwatch.core.state import S, WatchState

PSS_MIB, TREE_MIB, DEVICE_MIB = 264.0, 60000.0, 62500.0  # the device holds a tenant too
CONFIG = from_dict({
    "vllm": {"model": "/m"},
    "prewarm": {"enabled": False},
    "memory": {"gpu_growth_limit": 1000, "gpu_growth_rate": 100, "baseline_delay": 0,
               "sustain": 3, "sample_interval": 1, "pss_interval": 1, "slope_window": 60},
})


def _sample(kind: str, extra: float = 0.0) -> MemorySample:
    """A sample of one steady tree, its GPU figure read the way `kind` says."""
    tree = TREE_MIB + extra
    if kind == "nvml-process":
        return MemorySample(kind, (1,), tree, {0: tree}, {0: DEVICE_MIB + extra},
                            host_rss_mib=4091.0, host_pss_mib=PSS_MIB)
    if kind == "nvml-device":  # the process list failed: the device's figure
        return MemorySample(kind, (1,), None, {}, {0: DEVICE_MIB + extra},
                            host_rss_mib=4091.0, host_pss_mib=PSS_MIB)
    if kind == "host":  # neither NVML read answered
        return MemorySample(kind, (1,), None, host_rss_mib=4091.0, host_pss_mib=PSS_MIB)
    if kind == "unified":
        return MemorySample(kind, (1,), tree, {0: tree}, host_rss_mib=4091.0,
                            host_pss_mib=PSS_MIB)
    assert kind == "unified-host"  # unified, the per-process read failed
    return MemorySample("unified", (1,), None, host_rss_mib=4091.0, host_pss_mib=PSS_MIB)


def _feed(kinds: list[str], extra: float = 0.0) -> tuple[WatchState, list[Log]]:
    s, now = _ready(CONFIG)
    logs: list[Log] = []
    for kind in kinds:
        now += 1.0
        s, acts = machine.step(s, MemorySampled(_sample(kind, extra), 0, gen=1), now)
        logs += _logs(acts)
    return s, logs


def _logs(acts: list[Action]) -> list[Log]:
    return [a for a in acts if isinstance(a, Log)]


def _fired(logs: list[Log]) -> list[str]:
    return [str(a.fields["rule"]) for a in logs if a.event == "memory.rule_fired"]


def test_gpu_kind_names_how_the_figure_is_made() -> None:
    assert [gpu_kind(_sample(k)) for k in ("nvml-process", "nvml-device", "host", "unified",
                                           "unified-host")] == [
        "nvml-process", "nvml-device", "host", "unified", "unified-host"]
    assert gpu_kind(MemorySample("none", (), None)) is None


def test_a_glitch_at_the_baseline_does_not_make_the_tree_look_grown() -> None:
    # discrete GPU: both NVML reads failed once, at the baseline sample
    _, logs = _feed(["host", *["nvml-process"] * 20])
    assert not _fired(logs)
    # DGX Spark: the per-process read failed once: the host part alone, 60000 MiB less
    _, logs = _feed(["unified-host", *["unified"] * 20])
    assert not _fired(logs)


def test_a_glitch_mid_run_is_unknown_and_keeps_the_series() -> None:
    s, logs = _feed(["nvml-process"] * 5 + ["nvml-device", "host"] + ["nvml-process"] * 5)
    assert not _fired(logs)
    leak = s.run.mem.leak
    assert leak is not None and leak.gpu.baseline == TREE_MIB and leak.gpu.source == \
        "nvml-process"
    assert not [a for a in logs if a.event == "memory.series_restarted"]
    # what an incident record shows as the samples the rules judged: not the glitches
    assert [gpu for _, gpu, _ in s.run.mem.recent][-8:] == [TREE_MIB, None, None, *[TREE_MIB] * 5]


def test_a_lasting_change_restarts_the_series_once_and_says_so() -> None:
    s, logs = _feed(["nvml-process"] * 5 + ["nvml-device"] * 20)
    assert not _fired(logs)
    leak = s.run.mem.leak
    assert leak is not None and leak.gpu.source == "nvml-device"
    assert leak.gpu.baseline == DEVICE_MIB
    said = [a for a in logs if a.event == "memory.series_restarted"]
    assert len(said) == 1 and said[0].level == "warning"
    assert said[0].fields["previous"] == "nvml-process"
    assert said[0].fields["source"] == "nvml-device"
    assert said[0].fields["previous_baseline_mib"] == TREE_MIB


def test_growth_after_a_restarted_series_still_fires() -> None:
    s, now = _ready(CONFIG)
    fired: list[str] = []
    kinds = ["nvml-process"] * 5 + ["nvml-device"] * 8
    for i, kind in enumerate(kinds + ["nvml-device"] * 10):
        now += 1.0
        extra = 2000.0 if i >= len(kinds) else 0.0  # a real leak, seen on the new figure
        s, acts = machine.step(s, MemorySampled(_sample(kind, extra), 0, gen=1), now)
        fired += _fired(_logs(acts))
    assert fired and fired[0] == "gpu_growth_limit"


KINDS = ["nvml-process", "nvml-device", "host", "unified", "unified-host"]


@settings(max_examples=80, deadline=None)
@given(runs=st.lists(st.tuples(st.sampled_from(KINDS), st.integers(1, 12)), min_size=1,
                     max_size=12))
def test_steady_tree_never_fires_whatever_the_sources(runs: list[tuple[str, int]]) -> None:
    """The tree holds the same memory throughout; only how it is read changes."""
    kinds = [k for k, n in runs for _ in range(n)]
    s, logs = _feed(kinds)
    assert not _fired(logs), (kinds, _fired(logs))
    assert s.state == S.READY and restart.pending(s) is None
