"""A spare turned back on by a reload is built only beside an engine launched with its room
(hostile review of the spare's lifecycle): with `spare.enabled = false` the serving engine
is relaunched at the operator's own setting (0.90); a reload to `true` then planned a spare
that cannot fit beside it, and each build failed until spare.retries turned it off. The
build is deferred, not failed, until the engine's next launch takes the lowered setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.models import spare_config
from vllmwatch.config.schema import Config
from vllmwatch.core.events import Event
from vllmwatch.core.failover import SpareBuilt
from vllmwatch.shell import sparefx
from vllmwatch.shell.memory import make_sampler
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml
from vllmwatch.testing.world import LogCapture

ARGV = ("vllm", "serve", "m", "--gpu-memory-utilization", "0.90")


def test_a_spare_turned_on_again_waits_for_a_launch_with_its_room(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    on = spare_config(tmp_path)
    off = spare_config(tmp_path, spare={"enabled": "false"})
    sampler = make_sampler([0], LogCapture(), nvml=FakeNvml([FakeGpu(total_mib=143771.0)]))
    fx = sparefx.make(on, {"STATE_DIRECTORY": str(tmp_path / "state")}, sampler, False,
                      LogCapture())
    assert fx is not None
    posted: list[Event] = []
    assert fx._prepare(on, posted.append, 1) and not posted  # the first build: no launch yet
    lowered = fx.serving_argv(ARGV, on, launch=True)
    assert lowered != list(ARGV), "the plan lowers the serving engine for the spare"
    assert fx._prepare(on, posted.append, 2) and not posted  # beside it: it fits

    # spare.enabled = false by a reload, then a fault: the relaunch takes the full setting
    assert fx.serving_argv(ARGV, off, launch=True) == list(ARGV)
    fx.serving_argv(ARGV, on)  # the standby's next command is not a launch: nothing moves
    assert not fx._prepare(on, posted.append, 3)  # a reload turned it on again
    assert len(posted) == 1 and isinstance(posted[0], SpareBuilt)
    got = posted[0]
    assert got.deferred and not got.ok and got.build == 3, got
    flag = lowered.index("--gpu-memory-utilization")  # what it has, and what it needs
    assert "the operator's setting" in got.detail, got.detail
    assert f"--gpu-memory-utilization {lowered[flag + 1]}" in got.detail, got.detail
    assert "next launch" in got.detail and "SIGUSR1" in got.detail, got.detail
    # the next launch takes the lowered setting: the build after it goes ahead
    assert fx.serving_argv(ARGV, on, launch=True) == lowered
    assert fx._prepare(on, posted.append, 4) and len(posted) == 1


@pytest.mark.parametrize("flags,on,said", [
    (None, True, "not checked: whether the installed vLLM has sleep mode"),
    ({"enable-sleep-mode", "uds"}, True, ""),
    ({"uds"}, False, "no --enable-sleep-mode"),
    ({"enable-sleep-mode"}, False, "no --uds"),
], ids=["not-cached", "both", "no-sleep-mode", "no-uds"])
def test_the_daemons_plan_reads_vllms_cached_flags(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: set[str] | None, on: bool,
        said: str) -> None:
    """The daemon's plan never learnt whether vLLM has sleep mode and --uds (only `check`
    did): `auto` went on for a vLLM without sleep mode and every build failed, and `true`
    with a vLLM without --uds would have started a spare on the serving command's --port.
    It reads the flag list that `check` or the first launch cached (never asks vLLM)."""
    from vllmwatch.config import vllmflags, vllminfo
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    asked: list[bool] = []

    def known(command: object, version: object, cache: object, *, ask: bool = True,
              timeout: float = 0.0) -> vllmflags.FlagSet | None:
        asked.append(ask)
        return None if flags is None else vllmflags.FlagSet("0.26.0", frozenset(flags),
                                                           frozenset())
    monkeypatch.setattr(vllminfo, "version", lambda command: "0.26.0")
    monkeypatch.setattr(vllmflags, "known_flags", known)
    log = LogCapture()
    sampler = make_sampler([0], log, nvml=FakeNvml([FakeGpu(total_mib=143771.0)]))
    fx = sparefx.make(spare_config(tmp_path), {"STATE_DIRECTORY": str(tmp_path / "state")},
                      sampler, False, log)
    assert asked == [False], "the start asked vLLM (or never looked at the cache)"
    plan = log.named("spare.plan")[-1]
    assert (fx is not None) == on == plan["on"], plan
    text = f"{plan['reason']} {plan.get('todo', '')} {plan['lines']}"
    assert said in text if said else "not checked" not in text, text


def _built(awake: float, asleep: float = 1932.0) -> SpareBuilt:
    return SpareBuilt(True, "", 4242, awake, asleep)


def test_the_measured_footprint_replaces_the_estimate_before_the_first_launch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34 point 2: the figures come from what vllmwatch measured. A first build that
    measures a spare larger than estimated lowers the setting of the engine's launch that
    follows; the spare's own command never moves (a reload would call it stale); only the
    first build of a configuration is kept (a running engine cannot follow each rebuild's
    few MiB); a running engine is judged by the room it leaves, not by spelling."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    on = spare_config(tmp_path)
    log = LogCapture()
    sampler = make_sampler([0], log, nvml=FakeNvml([FakeGpu(total_mib=143771.0)]))
    fx = sparefx.make(on, {"STATE_DIRECTORY": str(tmp_path / "state")}, sampler, False, log)
    assert fx is not None
    est = fx.plan
    assert not est.measured and est.awake_mib is not None and est.serving_after is not None
    spare_flags = dict(est.spare_flags)
    posted: list[Event] = []
    assert fx._prepare(on, posted.append, 1) and not posted
    big = est.awake_mib + 12_000.0  # 12 GiB more than the estimate
    ev = _built(big)
    assert fx._measured(on, ev) is ev  # the core hears the build as it was
    plan = fx.plan
    assert plan.measured and plan.awake_mib == big and plan.asleep_mib == 1932.0
    assert plan.serving_after is not None and plan.serving_after < est.serving_after
    assert dict(plan.spare_flags) == spare_flags, "a measurement moved the spare's command"
    said = log.named("spare.plan")[-1]
    assert said["measured"] and said["awake_mib"] == round(big), said
    argv = fx.serving_argv(ARGV, on, launch=True)
    assert argv[argv.index("--gpu-memory-utilization") + 1] == f"{plan.serving_after:g}"
    # a rebuild measures a few MiB less: the plan (and the running engine's room) stay
    fx._measured(on, _built(big - 40.0))
    assert fx.plan is plan and len(log.named("spare.plan")) == 2
    assert fx._prepare(on, posted.append, 2) and not posted
    # an engine launched above the measured plan's setting: the next build waits for a launch
    fx.launched, fx.launched_at = {"gpu-memory-utilization": "0.9"}, 0.9
    assert not fx._prepare(on, posted.append, 3) and posted[-1].deferred  # type: ignore[attr-defined]


def test_a_running_engine_is_judged_by_its_setting_not_by_how_it_was_spelt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's own setting at the plan's figure (auto, no flag added) leaves the room
    that `true`'s added --gpu-memory-utilization leaves: a reload from one to the other
    builds at once; an engine launched above it (spare.enabled = false then) still waits."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    env = {"STATE_DIRECTORY": str(tmp_path / "state")}
    on = spare_config(tmp_path)
    sampler = make_sampler([0], LogCapture(), nvml=FakeNvml([FakeGpu(total_mib=143771.0)]))
    probe = sparefx.make(on, env, sampler, False, LogCapture())
    assert probe is not None and probe.plan.serving_after is not None
    bound = probe.plan.serving_after

    def operator(value: float, enabled: str) -> Config:
        return spare_config(tmp_path, spare={"enabled": enabled}, vllm={
            "args": {"max-model-len": 4096, "gpu-memory-utilization": value}})
    auto = operator(bound, "auto")
    fx = sparefx.make(auto, env, sampler, False, LogCapture())
    assert fx is not None and fx.plan.on and not fx.plan.serving_flags, fx.plan
    fx.serving_argv(ARGV, auto, launch=True)
    assert fx.launched == {} and fx.launched_at == bound
    posted: list[Event] = []
    assert fx._prepare(on, posted.append, 1) and not posted, posted
    assert fx.plan.serving_flags == {"gpu-memory-utilization": f"{bound:g}"}
    above = operator(round(bound + 0.05, 2), "false")
    fx.serving_argv(ARGV, above, launch=True)
    assert fx.launched_at == round(bound + 0.05, 2)
    assert not fx._prepare(on, posted.append, 2)
    assert isinstance(posted[-1], SpareBuilt) and posted[-1].deferred, posted


@pytest.mark.parametrize("where", ["args", "extra_args", "extra_args=", "env_file", "-tp"])
def test_the_plan_reads_the_flags_wherever_the_config_gives_them(
        tmp_path: Path, where: str) -> None:
    """The plan read [vllm.args] only: a TP of 2 or a utilization in extra_args, or a TP in
    vllm.env_file (VLLMWATCH_ARG_*), was planned as absent (a spare sized for one GPU's
    engine at the wrong setting). Of the env file only the sizes are read: its values are
    secret."""
    env = tmp_path / "vllm.env"
    env.write_text("VLLMWATCH_ARG_TENSOR_PARALLEL_SIZE=2\nVLLMWATCH_ARG_HF_TOKEN=hf_x\n")
    env.chmod(0o600)
    vllm: dict[str, object] = {
        "gpus": [0, 1],  # (one GPU per tensor-parallel rank: config/crosschecks._gpu_count)
        "args": {"max-model-len": 4096, **({"tensor-parallel-size": 2,
                                           "gpu-memory-utilization": 0.8}
                                          if where == "args" else {})},
        "extra_args": {"extra_args": ["--tensor-parallel-size", "2",
                                      "--gpu-memory-utilization", "0.8"],
                       "extra_args=": ["--tensor-parallel-size=2",
                                       "--gpu-memory-utilization=0.8"],
                       "-tp": ["-tp", "2", "--gpu-memory-utilization", "0.8"]}.get(where, []),
    }
    if where == "env_file":
        vllm["env_file"] = str(env)
    config = spare_config(tmp_path, spare={"enabled": "auto"}, vllm=vllm)
    got = sparefx.flags_of(config)
    assert got["tensor-parallel-size"] == 2, got
    assert "hf-token" not in got  # the env file's secret values are never read into it
    if where != "env_file":
        assert float(str(got["gpu-memory-utilization"])) == 0.8, got
