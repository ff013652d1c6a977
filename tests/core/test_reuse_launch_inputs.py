"""A cache miss explained by what changed outside the config since the launch that hit: the
installed vLLM (or torch) upgraded under the running daemon, or vllm.env_file edited in place
(the same path). vLLM's caches are keyed on both; the miss that follows is expected, said at
info naming the upgrade (or the file), not a 3 a.m. warning that lists cleared caches. A
version unknown on either side, or a rotated secret in the file, explains nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.core.test_startcaches import _crash_to_relaunch
from tests.core.test_truthful_signals import Core
from vllmwatch.config.schema import from_dict
from vllmwatch.core import reuse
from vllmwatch.core.actions import Log, Spawn
from vllmwatch.core.events import ChildOutput, Event, Spawned
from vllmwatch.core.state import S
from vllmwatch.shell import childrun


class LaunchCore(Core):
    """The core stepped by hand; each launch's Spawned carries `inputs` as the shell's does."""

    inputs: tuple[tuple[str, str], ...] = ()

    def step(self, ev: Event, dt: float = 1.0) -> list[Any]:
        self.now += dt
        from vllmwatch.core import machine
        self.s, acts = machine.step(self.s, ev, self.now)
        self.acts += acts
        if any(isinstance(a, Spawn) for a in acts):
            self.pid += 1
            self.step(Spawned(self.pid, inputs=self.inputs), 0.0)
        return acts


def _launch_ready(core: LaunchCore, hit: bool) -> None:
    from tests.core.test_reuse import PLAN_APPLIED, V026_WARM
    if core.s.state != S.STARTING:
        core.launch()
    for line in (*V026_WARM, PLAN_APPLIED) if hit else ():
        core.step(ChildOutput(None, True, reuse.facts_of(line)), 0.1)
    core.become_ready()


def _misses(first: tuple[tuple[str, str], ...], second: tuple[tuple[str, str], ...]
            ) -> list[Log]:
    core = LaunchCore()
    core.inputs = first
    _launch_ready(core, hit=True)
    assert core.s.last_hits == {"compile_cache": True, "aot_artifact": True,
                                "startup_plan": True}
    core.inputs = second  # what the shell reads at the relaunch (Spawned.inputs)
    _crash_to_relaunch(core)
    _launch_ready(core, hit=False)
    return [a for a in core.acts if isinstance(a, Log) and a.event == "startup.cache_missed"]


def test_a_miss_after_a_vllm_upgrade_is_info_naming_the_upgrade() -> None:
    missed = _misses(reuse.launch_inputs("0.31.0", "2.11.0", {}),
                     reuse.launch_inputs("0.32.0", "2.11.0", {}))
    assert {m.fields["cache"] for m in missed} == {"compile_cache", "aot_artifact",
                                                   "startup_plan"}
    for m in missed:
        assert m.level == "info" and m.fields["expected"] is True, m
        assert m.fields["likely_cause"] == ("vLLM 0.31.0 -> 0.32.0 (installed since the "
                                            "launch that hit)"), m


def test_a_torch_upgrade_alone_explains_the_miss_too() -> None:
    missed = _misses(reuse.launch_inputs("0.32.0", "2.11.0", {}),
                     reuse.launch_inputs("0.32.0", "2.12.0", {}))
    assert missed and all(m.level == "info" for m in missed)
    assert all("torch 2.11.0 -> 2.12.0" in str(m.fields["likely_cause"]) for m in missed)


def test_an_env_file_edited_in_place_explains_the_miss() -> None:
    missed = _misses(reuse.launch_inputs("0.32.0", None, {"VLLM_USE_V2_RUNNER": "0"}),
                     reuse.launch_inputs("0.32.0", None, {"VLLM_USE_V2_RUNNER": "1"}))
    assert missed and all(m.level == "info" and m.fields["expected"] for m in missed)
    assert all(m.fields["likely_cause"] == "vllm.env_file's variables changed since the "
               "launch that hit" for m in missed)


def test_a_rotated_secret_in_the_env_file_or_an_unknown_version_explains_nothing() -> None:
    for first, second in (
            (reuse.launch_inputs("0.32.0", None, {"HF_TOKEN": "hf_old"}),
             reuse.launch_inputs("0.32.0", None, {"HF_TOKEN": "hf_new"})),
            # a token under a name that says nothing (GH_PAT): the redactor hides it as a
            # secret (launch.env_file_secret), and its rotation keys no cache either
            (reuse.launch_inputs("0.32.0", None, {"GH_PAT": "ghp_Old7TokenValue"}),
             reuse.launch_inputs("0.32.0", None, {"GH_PAT": "ghp_New7TokenValue"})),
            (reuse.launch_inputs("0.32.0", "2.11.0", {}),
             reuse.launch_inputs(None, None, {}))):  # the version read timed out
        missed = _misses(first, second)
        assert missed and all(m.level == "warning" and not m.fields["expected"]
                              for m in missed), missed
        assert "hf_" not in repr(missed)


def test_the_launch_carries_the_versions_and_the_env_files_variables(tmp_path: Path) -> None:
    env_file = tmp_path / "vllm.env"
    config = from_dict({"vllm": {"model": "/m", "gpus": [], "env_file": str(env_file),
                                 "env": {"TMPDIR": str(tmp_path)}}})
    parts = []
    for text in ("VLLM_USE_V2_RUNNER=0\n", "VLLM_USE_V2_RUNNER=1\n"):  # edited in place
        env_file.write_text(text)
        env_file.chmod(0o600)
        got = childrun.prepare(config, {"PATH": "/usr/bin:/bin"}, "0123456789abcdef",
                               "0.32.0", {}, lambda *a, **k: None, "2.11.0")
        assert isinstance(got, childrun.Prepared), got
        parts.append(dict(got.inputs))
    assert parts[0][reuse.VLLM] == "0.32.0" and parts[0][reuse.TORCH] == "2.11.0"
    assert parts[0][reuse.ENV_FILE] != parts[1][reuse.ENV_FILE]


def test_adding_adapters_or_a_larger_lora_rank_explains_the_compile_miss(tmp_path: Path) -> None:
    """[[adapters]] add --enable-lora --max-loras --max-lora-rank to vLLM's command: its LoRA
    config is in the compile cache's key, so the reload that adds the first adapter (or one of
    a larger rank) is why the next launch compiles; another adapter of the same size is not."""
    from tests.core.test_adapters_config import adapter_dir, cfg
    plain = cfg([])
    one = cfg([{"name": "a", "path": adapter_dir(tmp_path, "a", r=8)}])
    same = cfg([{"name": "b", "path": adapter_dir(tmp_path, "b", r=8)}])
    wide = cfg([{"name": "c", "path": adapter_dir(tmp_path, "c", r=64)}])
    hit, miss = {"compile_cache": True}, {"compile_cache": False}
    for before, after in ((plain, one), (one, wide)):
        [(_, why, expected)] = reuse.misses(hit, miss, {}, reuse.inputs(before),
                                                reuse.inputs(after))
        assert expected and why == "a reload changed lora (--max-loras, --max-lora-rank)", why
    [(_, why, expected)] = reuse.misses(hit, miss, {}, reuse.inputs(one), reuse.inputs(same))
    assert not expected, why
