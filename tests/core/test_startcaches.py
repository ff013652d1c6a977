"""vLLM's start-up caches turned on for the child (issue 33, config/startcaches.py): on by
default where the installed vLLM has them, the operator's own value wins, one switch each
turns them off, a vLLM without them gets nothing and no warning; an operator's
VLLM_USE_STANDALONE_COMPILE=0 with the mega AOT artifact on is refused with the reason. And
on the core: child.ready carries the reuse, a relaunch that missed a cache logs a warning."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.core.test_truthful_signals import Core
from vllmwatch.config.schema import ConfigError, from_dict
from vllmwatch.config.startcaches import MEGA, PLAN, STANDALONE, VllmInfo, decide, problems
from vllmwatch.core.actions import Log
from vllmwatch.core.events import ChildExited, ChildOutput, ReloadRequested, Tick
from vllmwatch.core.reuse import facts_of
from vllmwatch.core.state import S

V026 = VllmInfo("0.26.0", "2.11.0+cu130", frozenset({PLAN, MEGA, STANDALONE}))
V032 = VllmInfo("0.32.0", "2.13.0+cpu", frozenset({PLAN, MEGA, STANDALONE}))
FAKE = VllmInfo("0.0.0+fake", None, frozenset())  # a vLLM without these variables
UNKNOWN = VllmInfo()


def conf(prewarm: dict[str, Any] | None = None, env: dict[str, str] | None = None,
         gpus: list[int] | None = None) -> Any:
    vllm: dict[str, Any] = {"model": "/m", "env": env or {}}
    if gpus is not None:
        vllm["gpus"] = gpus
    return from_dict({"vllm": vllm, "prewarm": prewarm or {}})


def test_auto_turns_the_plan_on_for_a_gpu_launch_where_vllm_has_it() -> None:
    d = decide(conf(), {}, V026, unified=False)
    assert d.env == {PLAN: "1"}  # and the artifact left to vLLM's default (torch 2.11: off)
    assert "vLLM's own default (off: torch 2.11.0+cu130 < 2.12" in d.why["mega_aot_artifact"]


def test_torch_2_12_and_later_leave_the_artifact_to_vllm_it_is_on_there() -> None:
    d = decide(conf(), {}, V032, unified=False)
    assert MEGA not in d.env and "on: torch 2.13.0+cpu >= 2.12" in d.why["mega_aot_artifact"]


@pytest.mark.parametrize("info", [FAKE, UNKNOWN], ids=["no-variables", "unknown"])
def test_a_vllm_without_the_caches_gets_nothing(info: VllmInfo) -> None:
    assert decide(conf(), {}, info, unified=False).env == {}
    # (and no warning: the decision is logged once as info, shell/effects.py)


@pytest.mark.parametrize("where", ["vllm.env", "environ"])
@pytest.mark.parametrize("value", ["0", "1"])
def test_the_operators_own_value_wins(where: str, value: str) -> None:
    own = {PLAN: value, MEGA: value, STANDALONE: "1"}
    c = conf({"startup_plan": True, "mega_aot_artifact": True},
             env=own if where == "vllm.env" else None)
    d = decide(c, own if where == "environ" else {}, V026, unified=False)
    assert d.env == {}  # nothing of ours: [vllm.env] or the daemon's environment stands
    assert d.why["startup_plan"] == f"{PLAN} set by the operator"


def test_the_switches_turn_them_off() -> None:
    d = decide(conf({"startup_plan": False, "mega_aot_artifact": False}), {}, V032, False)
    assert d.env == {MEGA: "0"}  # vLLM's own default (torch 2.13) turned off; the plan unset
    off = decide(conf({"enabled": False}), {}, V026, unified=False)
    assert off.env == {}


def test_the_artifact_is_an_opt_in_on_older_torch_with_standalone_compile() -> None:
    d = decide(conf({"mega_aot_artifact": True}), {}, V026, unified=False)
    assert d.env == {PLAN: "1", MEGA: "1", STANDALONE: "1"}
    own = decide(conf({"mega_aot_artifact": True}, env={STANDALONE: "1"}), {}, V026, False)
    assert STANDALONE not in own.env


def test_the_plan_stays_off_on_cpu_and_on_unified_memory_unless_forced() -> None:
    assert PLAN not in decide(conf(gpus=[]), {}, V032, unified=False).env
    spark = decide(conf(), {}, V026, unified=True)
    assert PLAN not in spark.env and "page cache" in spark.why["startup_plan"]
    assert decide(conf({"startup_plan": True}), {}, V026, unified=True).env[PLAN] == "1"


def test_standalone_compile_0_with_the_artifact_is_refused_by_config_validation() -> None:
    with pytest.raises(ConfigError) as err:
        conf({"mega_aot_artifact": True}, env={STANDALONE: "0"})
    text = str(err.value)
    assert f"vllm.env.{STANDALONE}" in text and "vLLM refuses to start" in text
    with pytest.raises(ConfigError):
        conf(env={STANDALONE: "0", MEGA: "1"})
    conf(env={STANDALONE: "0"})  # no artifact: fine


def test_standalone_compile_0_in_the_environment_is_refused_at_launch() -> None:
    c = conf({"mega_aot_artifact": True})
    found = problems(c, {STANDALONE: "0"}, V026)
    assert found and found[0].key == "prewarm.mega_aot_artifact"
    assert "the daemon's environment" in found[0].problem
    # torch >= 2.12: vLLM's own default turns the artifact on, so 0 is refused there too
    assert problems(conf(), {STANDALONE: "0"}, V032)
    assert not problems(conf(), {STANDALONE: "0"}, V026)
    # ... unless AOT compile is off there (vLLM's default then leaves the artifact off)
    assert not problems(conf(), {STANDALONE: "0", "VLLM_USE_AOT_COMPILE": "0"}, V032)
    assert not problems(conf(), {STANDALONE: "0", "VLLM_DISABLE_COMPILE_CACHE": "1"}, V032)


# ---- the core: child.ready carries the reuse; a miss after a hit is a warning ----

APPLIED = ("(EngineCore pid=1) INFO 12-01 20:47:52 [startup_plan.py:150] Applying persisted "
           "startup plan (fingerprint 3f9a0c1d2b4e5f60): kv_cache_memory_bytes=116391570944 "
           "(108.40 GiB), recorded free-memory baseline 139.29 GiB, current 139.29 GiB. "
           "Memory profiling will be skipped.")
REFUSED = ("(EngineCore pid=1) INFO 12-01 20:47:52 [startup_plan.py:128] Startup plan not "
           "applied: current free memory (120.10 GiB) is below the recorded baseline (139.29 "
           "GiB); falling back to full memory profiling.")


def _crash_to_relaunch(core: Core) -> None:
    """A crash: back to STARTING after the backoff."""
    core.step(ChildExited(core.pid, 1, None))
    for _ in range(40):
        if core.s.state == S.STARTING:
            break
        core.step(core.cleanup_answer() if core.s.state == S.CLEANUP else Tick(), 5.0)


def _start(core: Core, *lines: str, hit: bool = False) -> None:
    for line in lines:
        core.step(ChildOutput(None, hit, facts_of(line)), 0.1)
    core.become_ready()


def test_child_ready_carries_the_reuse_and_a_miss_after_a_hit_warns() -> None:
    core = Core()
    core.launch()
    _start(core, APPLIED, hit=True)
    ready = core.events("child.ready")[-1]
    assert ready["reuse"] == {"startup_plan": "applied", "startup_plan_kv_bytes": 116391570944}
    assert ready["compile_cache_hit"] is True
    assert not core.events("startup.cache_missed")
    _crash_to_relaunch(core)
    _start(core, REFUSED, hit=True)
    missed = core.events("startup.cache_missed")
    assert [m["cache"] for m in missed] == ["startup_plan"]
    assert str(missed[0]["likely_cause"]).startswith("vLLM said: Startup plan not applied")


def test_check_refuses_standalone_compile_0_from_the_environment(tmp_path: Any) -> None:
    from vllmwatch.check.base import FAIL, PASS, Context
    from vllmwatch.check.vllm import check_start_caches
    c = conf({"mega_aot_artifact": True})
    bad = check_start_caches(Context(c, fast=True, env={STANDALONE: "0"}))
    assert bad.status == FAIL and "prewarm.mega_aot_artifact" in bad.detail
    assert "vLLM refuses to start" in bad.detail
    ok = check_start_caches(Context(c, fast=True, env={}))
    assert ok.status == PASS and "prewarm.mega_aot_artifact = true" in ok.detail


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "full"])
def test_check_fast_and_full_both_refuse_what_vllms_own_default_makes_fatal(
        fast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch >= 2.12: vLLM's own default turns the artifact on; an operator's 0 for
    VLLM_USE_STANDALONE_COMPILE is then refused by `run` (78), so by both checks too (the
    ExecStartPre one is --fast)."""
    from vllmwatch.check import vllm as checks
    from vllmwatch.check.base import FAIL, PASS, Context
    monkeypatch.setattr(checks.vllminfo, "info", lambda command: V032)
    bad = checks.check_start_caches(Context(conf(), fast=fast, env={STANDALONE: "0"}))
    assert bad.status == FAIL and "vLLM's own default for torch 2.13.0+cpu >= 2.12" in bad.detail
    monkeypatch.setattr(checks.vllminfo, "info", lambda command: V026)  # torch 2.11: off
    assert checks.check_start_caches(Context(conf(), fast=fast, env={STANDALONE: "0"})
                                     ).status == PASS


def test_status_and_the_incident_report_show_the_last_launchs_reuse_in_one_line() -> None:
    from vllmwatch.incident.report import render as report
    from vllmwatch.status.cli import render as status
    reused = {"startup_plan": "applied", "startup_plan_kv_bytes": 116391570944,
              "aot_loaded": True, "compile_s": 0.31, "graphs_s": 5.0, "weights_s": 2.0,
              "compile_cache_hit": True, "startup_plan_why": "\x1b[31mred"}
    text = status({"state": "ready", "ready": True, "start_reuse": reused}, now=0.0)
    [line] = [ln for ln in text.splitlines() if ln.startswith("reused")]
    assert line.split(None, 1)[1] == ("compile cache hit, AOT artifact loaded, startup plan "
                                      "applied (KV 108.4 GiB); weights 2 s, torch.compile "
                                      "0.31 s, CUDA graphs 5 s")
    page = report({"id": "x", "core": {"start_reuse": reused, "compile_cache_hit": False}})
    assert "last launch reused: compile cache miss, AOT artifact loaded" in page
    assert "\x1b" not in text + page


# ---- a miss a reload explains is expected (info, the changed key named), not a warning ----

def _hit_then_relaunch(config_after: Any, *second: str, hit: bool = False) -> Core:
    """READY with every cache hit, a reload to `config_after`, a crash, the relaunch READY with
    the `second` start's lines (no compile-cache hit)."""
    from tests.core.test_reuse import PLAN_APPLIED, V026_WARM
    core = Core()
    core.launch()
    _start(core, *V026_WARM, PLAN_APPLIED, hit=True)
    assert core.s.last_hits == {"compile_cache": True, "aot_artifact": True,
                                "startup_plan": True}
    core.step(ReloadRequested(config_after))
    _crash_to_relaunch(core)
    _start(core, *second, hit=hit)
    return core


def _with(**prewarm: Any) -> Any:
    from tests.core.test_truthful_signals import CONFIG
    return replace(CONFIG, prewarm=replace(CONFIG.prewarm, **prewarm))


def test_switching_the_artifact_explains_the_compile_misses_not_the_plans() -> None:
    from tests.core.test_reuse import P
    from tests.core.test_truthful_signals import CONFIG
    core = _hit_then_relaunch(replace(_with(mega_aot_artifact="true"), path=CONFIG.path))
    # (auto -> true: the artifact now asked for, a new compile-cache key; true -> false the same)
    missed = {str(m["cache"]): m for m in core.events("startup.cache_missed")}
    assert set(missed) == {"compile_cache", "aot_artifact", "startup_plan"}
    for cache in ("compile_cache", "aot_artifact"):
        assert missed[cache]["expected"] is True
        assert missed[cache]["likely_cause"] == ("a reload changed prewarm.mega_aot_artifact "
                                                 "(auto -> true)")
    # the plan's miss is not the artifact switch's doing: still a warning, the usual causes
    assert missed["startup_plan"]["expected"] is False
    assert "plan file was removed" in str(missed["startup_plan"]["likely_cause"])
    levels = {(a.event, a.fields.get("cache")): a.level for a in core.acts
              if isinstance(a, Log) and a.event == "startup.cache_missed"}
    assert levels == {("startup.cache_missed", "compile_cache"): "info",
                      ("startup.cache_missed", "aot_artifact"): "info",
                      ("startup.cache_missed", "startup_plan"): "warning"}
    assert P  # (the fixtures' prefix: the lines are vLLM 0.26's, verbatim)


def test_turning_the_plan_off_explains_its_miss_and_nothing_else() -> None:
    from tests.core.test_reuse import V026_WARM
    core = _hit_then_relaunch(_with(startup_plan="false"), *V026_WARM, hit=True)
    [missed] = core.events("startup.cache_missed")
    assert missed["cache"] == "startup_plan" and missed["expected"] is True
    assert missed["likely_cause"] == "a reload changed prewarm.startup_plan (auto -> false)"


def test_a_changed_vllm_env_value_is_named_never_shown() -> None:
    from tests.core.test_truthful_signals import CONFIG
    value = "/srv/models/private-name-of-a-checkpoint"
    after = replace(CONFIG, vllm=replace(CONFIG.vllm, env={"VLLM_PLUGIN_DIR": value}))
    core = _hit_then_relaunch(after)
    missed = core.events("startup.cache_missed")
    assert missed and all(m["expected"] is True for m in missed)
    assert all(m["likely_cause"] == "a reload changed vllm.env.VLLM_PLUGIN_DIR" for m in missed)
    logs = [a for a in core.acts if isinstance(a, Log)]
    assert value not in repr(logs) + repr(core.s.last_inputs)


@pytest.mark.parametrize("where", ["env", "args"])
def test_a_rotated_secret_explains_no_miss(where: str) -> None:
    """A token or key keys no cache: rotating one (a routine reload) must not hide a cache
    that was cleared or broke under the same reload as "expected"."""
    from tests.core.test_truthful_signals import CONFIG
    v = CONFIG.vllm
    after = replace(CONFIG, vllm=replace(v, env={**v.env, "HF_TOKEN": "hf_rotated"})
                    if where == "env" else replace(v, args={**v.args, "api-key": "sk-new"}))
    core = _hit_then_relaunch(after)
    missed = core.events("startup.cache_missed")
    assert missed and not [m for m in missed if m["expected"]], missed
    assert "hf_rotated" not in repr(core.s.last_inputs) + repr(missed)


def test_a_reload_during_the_start_is_not_that_launchs_config() -> None:
    """A prewarm switch changes no running launch (no relaunch): a reload during a start that
    hits leaves that launch's inputs as they were; the next launch's miss is the reload's."""
    from tests.core.test_reuse import PLAN_APPLIED, V026_WARM
    core = Core()
    core.launch()
    _start(core, *V026_WARM, PLAN_APPLIED, hit=True)
    _crash_to_relaunch(core)
    core.step(ReloadRequested(_with(startup_plan="false")))
    assert core.s.state == S.STARTING  # the start goes on, launched with the plan on
    [said] = core.events("config.reloaded")  # and the log says when the switch applies
    assert said["restart_needed"] is False, said
    assert said["at_next_launch"] == "prewarm.startup_plan", said
    _start(core, *V026_WARM, PLAN_APPLIED, hit=True)
    assert core.s.last_inputs["prewarm.startup_plan"] == "auto"
    _crash_to_relaunch(core)
    _start(core, *V026_WARM, hit=True)
    [missed] = core.events("startup.cache_missed")
    assert missed["cache"] == "startup_plan" and missed["expected"] is True, missed


def test_without_a_change_the_same_miss_stays_a_warning_with_the_usual_cause() -> None:
    from tests.core.test_truthful_signals import CONFIG
    core = _hit_then_relaunch(CONFIG)
    missed = core.events("startup.cache_missed")
    assert {m["cache"] for m in missed} == {"compile_cache", "aot_artifact", "startup_plan"}
    assert all(m["expected"] is False for m in missed)
    assert "cache under prewarm.cache_dir was cleared" in str(
        next(m["likely_cause"] for m in missed if m["cache"] == "compile_cache"))


@pytest.mark.parametrize("key", ["gpus", "env_file"])
def test_moving_to_other_gpus_or_another_env_file_explains_the_misses(key: str) -> None:
    """A reload that moves vLLM to other GPUs (another model of card: another device in the
    plan's and the compile cache's keys) or names another vllm.env_file (other variables)
    explains the misses that follow: not a warning naming upgrades and cleared caches."""
    from tests.core.test_truthful_signals import CONFIG
    v = CONFIG.vllm
    after = replace(CONFIG, vllm=replace(v, gpus=[1]) if key == "gpus" else
                    replace(v, env_file="/etc/vllmwatch/other.env"))
    core = _hit_then_relaunch(after)
    missed = core.events("startup.cache_missed")
    assert missed and all(m["expected"] is True for m in missed), missed
    assert all(m["likely_cause"] == f"a reload changed vllm.{key}" for m in missed)


def test_a_launch_killed_before_vllm_compiled_shows_no_compile_cache_miss() -> None:
    """A launch that never got to vLLM's compile (killed while loading weights, or one still
    loading) read no cache: its incident report and `vllmwatch status` must not point the
    reader at a compile-cache miss."""
    from vllmwatch.incident.report import render as report
    from vllmwatch.status.cli import render as status
    early = {"load_start": 3.0}  # no vLLM line past the weights
    text = status({"state": "starting", "ready": False, "start_phases_s": early,
                   "start_reuse": {"compile_cache_hit": False}}, now=0.0)
    [line] = [ln for ln in text.splitlines() if ln.startswith("reused")]
    assert line.split(None, 1)[1] == "compile cache not reached"
    page = report({"id": "x", "core": {"start_reuse": {}, "compile_cache_hit": False,
                                       "start_phases_s": {}}})
    assert "last launch reused: compile cache not reached" in page
    late = report({"id": "x", "core": {"start_reuse": {"compile_s": 5.0},
                                       "compile_cache_hit": False,
                                       "start_phases_s": {"compile": 9.0}}})
    assert "last launch reused: compile cache miss; torch.compile 5 s" in late
