"""bench/gpu's dry run: every GPU phase's steps on this machine, over the fake vLLM and the
fake NVML, so that the driver cannot rot unseen between runs on the lent GPU machines.

Models are stamp files (the fake serves any path), measured waits shrink 50-fold and ports
are free ones; what needs torch (the probe's imports, the direct FlashAttention call,
model.py) runs and reports its failure, as it would on a machine without CUDA. Each phase
must end "ok", start and stop what it starts (nothing of the run's own is left), and reach
READY again after each fault that the fake's tree can take.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.gpu.cli import main
from bench.gpu.nvml import Nvml
from bench.gpu.phases import PHASES
from bench.gpu.phases.caches import STEPS
from bench.gpu.phases.hangs import DRY_RUNS
from bench.gpu.run import Run
from tests.support import FAKE, REPO, TIMEOUT_SCALE, wait_for
from tests.support.procs import owned
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml

# Faults whose target the fake's tree has: READY must come back after each.
RECOVERS = {"watch": ["kill_engine"], "big": ["kill_engine"], "matrix": ["kill_engine"],
            "faults": ["engine_kill9", "engine_sigstop", "api_server_sigkill"],
            "tp2": ["worker_kill9", "worker_sigstop"], "pair": ["engine_kill9_a"],
            "tp2big": ["worker_tp1_kill9", "engine_kill9"], "tp2api": ["engine_kill9"],
            "tp2apikill": ["engine_kill9"], "standby": ["engine_kill9", "api_server_sigkill"],
            "standbyoff": ["engine_kill9", "api_server_sigkill"], "standbyapi2": ["engine_kill9"],
            "hangstop": [f"sigstop_{i}" for i in range(1, DRY_RUNS + 1)],
            "incident": ["engine_sigstop"], "cacheson": ["engine_kill9", "api_server_sigkill"],
            "cachesoff": ["engine_kill9", "api_server_sigkill"]}
# Phases whose restarts the standby takes (issue 28): at least one launch by it.
BY_STANDBY = {"standby", "standbyapi2"}
# The standby phases (issue 27): each fault's restart_timing must reach READY again.
TIMED = {"tp2standby": ["engine_kill9", "worker_tp1_kill9", "sigusr1"],
         "tp2standbyoff": ["engine_kill9", "worker_tp1_kill9", "sigusr1"]}


def dry_run(tmp_path: Path) -> Run:
    return Run(out=tmp_path / "out", work=tmp_path / "work", vw_src=REPO, vllm=list(FAKE),
               vllmwatch=[sys.executable, "-m", "vllmwatch"],
               nv=Nvml(FakeNvml([FakeGpu(), FakeGpu()])), deadline=time.monotonic() + 3600,
               dry=True, time_scale=0.02)


def lines(run: Run) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (run.out / "summary.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("phase", [p.name for p in PHASES])
def test_every_phase_runs_its_steps_on_the_fakes(tmp_path: Path, phase: str) -> None:
    run = dry_run(tmp_path)
    try:
        assert main([phase], run=run) == 0
    finally:
        run.sweep("test")  # never leak into the next test, even on failure
    got = lines(run)
    ends = [ln for ln in got if ln["what"] == "end"]
    assert [(e["phase"], e["status"]) for e in ends] == [(phase, "ok")], \
        "\n".join(json.dumps(ln)[:400] for ln in got[-15:])
    assert json.loads((run.work / "state.json").read_text())["done"][phase]["status"] == "ok"
    for what in RECOVERS.get(phase, []):
        hits = [ln for ln in got if ln["what"] == what]
        assert hits and hits[0]["ready_again_after_fault_s"] is not None, (what, hits)
    for what in TIMED.get(phase, []):
        hits = [ln for ln in got if ln["what"] == "restart_timing" and ln["fault"] == what]
        assert hits and hits[0]["begin_to_ready_s"] is not None, (what, hits)
        assert hits[0]["release"]["released_all_gpus"] and not hits[0]["old_tree_alive"], hits
        # with the standby on, it takes every relaunch; off: never
        assert hits[0]["launch"] == ("fresh" if phase.endswith("off") else "standby"), hits
    if phase == "pairstandby":
        (b,) = [ln for ln in got if ln["what"] == "b_untouched"]
        assert b["a_ready_again"] and b["b_same_child"] and b["b_gpu_same_procs"], b
        assert [e for e in b["b_events"] if e.startswith(("restart", "child"))] == [], b
        assert b["b_standby_alive"] and b["b_same_standby"] and b["a_launch"] == "standby"
    for gone in (ln for ln in got if ln["what"] == "standby_after_stop"):
        assert not gone["alive"], gone
    if phase in BY_STANDBY:
        assert any(ln.get("launch") == "standby" for ln in got if ln["what"] == "restart_timing")
    if phase in ("standby", "standbyoff", "standbyapi2"):  # each fault after a stable run
        timings = [ln for ln in got if ln["what"] == "restart_timing" and "error" not in ln]
        assert timings and all(ln["failures_in_row"] <= 1 and ln["backoff_s"] == 0.0
                               for ln in timings), timings
    if phase == "incident":  # the hang's record, with the stopped engine read by py-spy
        [rec] = [ln for ln in got if ln["what"] == "record"]
        engine = [p for p in rec["processes"] if p["role"] == "engine_core"]
        assert engine and engine[0]["dumps"]["py-spy"][0], rec
    if phase.startswith("caches"):
        _caches_checks(phase, got)
    stops = [ln for ln in got if ln["what"] == "sigterm_vllmwatch"]
    assert [s["exit_code"] for s in stops] == [0] * len(stops), stops
    # What a stop left for the sweep to kill (a zombie only waits to be reaped).
    swept = [p for ln in got if ln["what"] == "sweep_killed" for p in ln["processes"]]
    assert [p for p in swept + run.ours() if p["state"] != "Z"] == []


# Issue 33: what each plain start reused (the fake plays vLLM's caches), in STEPS order.
REUSED = {"cold": {"startup_plan": None, "aot_saved": None}, "neither": {"startup_plan": None},
          "plan-writing": {"startup_plan": "saved"}, "plan": {"startup_plan": "applied"},
          "artifact-writing": {"aot_saved": True, "startup_plan": None},
          "artifact": {"aot_loaded": True, "startup_plan": None},
          "both": {"aot_loaded": True, "startup_plan": "applied"},
          "both-writing": {"aot_saved": True, "startup_plan": "saved"}}


def _caches_checks(phase: str, got: list[dict[str, Any]]) -> None:
    starts = [ln for ln in got if ln["what"] == "plain_start"]
    for s in starts:  # each start reached READY and says what it reused, as expected
        assert s["launch_to_ready_s"] is not None and s["texts"], s
        want = REUSED[s["config"]]
        assert {k: s["reuse"].get(k) for k in want} == want, s
    if phase == "cachesplain":
        assert [s["config"] for s in starts] == [label for label, _ in STEPS], starts
        summaries = {ln["config"]: ln["n"] for ln in got if ln["what"] == "config_summary"}
        assert summaries == {"neither": 3, "plan": 3, "artifact": 3, "both": 3}, summaries
    if phase == "cachesprep":  # the cold reference, then both caches written
        assert [s["config"] for s in starts] == ["cold", "both-writing"], starts
        assert [ln["cold_s"] for ln in got if ln["what"] == "cold_reference"], got
    if phase in ("cachesplain", "cacheson", "cachesoff", "cachesprep"):
        [eq] = [ln for ln in got if ln["what"] == "greedy_equal"]
        # token ids, GREEDY_TOKENS for each prompt, of at least two starts, all equal
        assert eq["equal"] and len(eq["compared"]) >= 2 and eq["full"] == eq["compared"], eq
        assert all(len(one) == eq["tokens_each"] for ids in eq["ids"].values() for one in ids)
    if phase in ("cacheson", "cachesoff"):  # the relaunched child's outputs are compared too
        [eq] = [ln for ln in got if ln["what"] == "greedy_equal"]
        assert f"{phase}-relaunched" in eq["compared"], eq
        # each relaunch's seconds, split at vLLM's own lines, add up to its total
        segs = [ln["seconds"] for ln in got if ln["what"] == "relaunch_segments"
                and ln["seconds"]]
        assert segs and all({"weights", "torch_compile", "cuda_graphs"} <= set(x) for x in segs)
        assert all(abs(sum(v for k, v in x.items() if k != "total") - x["total"]) < 0.1
                   for x in segs), segs
    for t in (ln for ln in got if ln["what"] == "restart_timing" and "error" not in ln):
        assert isinstance(t["reuse"], dict) and t["failures_in_row"] <= 1, t


def test_auto_runs_the_auto_phases_in_order_and_never_twice(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    ran: list[str] = []
    import bench.gpu.cli as cli
    from bench.gpu.phases import Phase

    fake = tuple(Phase(p.name, lambda run, n=p.name: ran.append(n), p.est, p.auto)
                 for p in PHASES)
    monkeypatch.setattr(cli, "PHASES", fake)
    monkeypatch.setattr(cli, "BY_NAME", {p.name: p for p in fake})
    run = dry_run(tmp_path)
    assert main(["auto"], run=run) == 0
    assert ran == [p.name for p in PHASES if p.auto]
    assert main(["auto"], run=run) == 0 and len(ran) == len([p for p in PHASES if p.auto])
    run.deadline = time.monotonic() + 1  # nothing fits: auto stops and says so
    (run.work / "state.json").unlink()
    assert main(["auto"], run=run) == 0
    assert lines(run)[-2]["what"] == "stop" and len(ran) == len([p for p in PHASES if p.auto])


def test_vllm_h200_drive_runs_from_an_export(tmp_path: Path) -> None:
    """`vllm_h200.sh drive` as the GPU machine runs it: from an export of vllmwatch/,
    bench/gpu/ and scripts/make_tiny_model.py only (no bench/__init__.py, no tests/)."""
    export = tmp_path / "vw"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("vllmwatch", "bench/gpu"):
        shutil.copytree(REPO / part, export / part, ignore=skip)
    (export / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "make_tiny_model.py", export / "scripts")
    env = {**os.environ, "OUT": str(tmp_path / "out"), "VLLM_H200_WORK": str(tmp_path / "w"),
           "VW_DIR": str(export), "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
           f"{os.environ.get('PATH', '')}"}
    r = subprocess.run(["bash", str(export / "bench/gpu/vllm_h200.sh"), "drive", "probe0",
                        "--budget", "120"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300 * TIMEOUT_SCALE)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    got = [json.loads(ln) for ln in (tmp_path / "out" / "summary.jsonl").read_text().splitlines()]
    assert [ln["status"] for ln in got if ln["what"] == "end"] == ["ok"]
    assert {"host", "gpu", "packages"} <= {ln["what"] for ln in got if ln["phase"] == "probe0"}
    assert (tmp_path / "out" / "logs.tar.gz").is_file()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_fork_or_spawn_is_told_by_the_memory_layout(method: str) -> None:
    """bench/gpu/standbys.py tells how vLLM started a TP worker from /proc/PID/stat: a fork
    keeps its parent's start_brk/arg_start/env_start, an exec'd spawn gets new ones.

    The spawn case is the exec of a fresh interpreter, which is what multiprocessing's spawn
    does, without multiprocessing: its spawn context starts a resource tracker that outlives
    the test (the session's leftover check failed the run on it)."""
    import multiprocessing

    from bench.gpu.standbys import memory_layout

    if method == "spawn":
        # a lifetime, not a wait: its owner kills it
        with owned([sys.executable, "-c", "import time; time.sleep(60)"]) as proc:
            mine, theirs = memory_layout(proc.pid), memory_layout(os.getpid())
            assert mine is not None and theirs is not None and mine != theirs
        return
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    child.start()
    try:
        assert child.pid is not None
        mine, theirs = memory_layout(child.pid), memory_layout(os.getpid())
        assert mine is not None and theirs is not None and mine == theirs
    finally:
        child.kill()
        child.join(10 * TIMEOUT_SCALE)


def test_the_spare_phase_takes_its_faults_and_the_spare_off_from_the_environment() -> None:
    """`SPARE_FAULTS=hang,gpu_leak SPARE_ENABLED=false bash $S drive spare`: the same run's
    relaunches without the spare beside those with it (docs/GPU.md section 15)."""
    from bench.gpu.phases.spare import FAULTS, choice

    assert choice({}) == (None, True)
    assert choice({"SPARE_FAULTS": " hang, gpu_leak ,engine_kill9",
                   "SPARE_ENABLED": "False"}) == (("hang", "gpu_leak", "engine_kill9"), False)
    assert choice({"SPARE_FAULTS": ",".join(FAULTS)}) == (FAULTS, True)
    for bad in ({"SPARE_FAULTS": "hang,kill"}, {"SPARE_ENABLED": "off"}):
        with pytest.raises(SystemExit) as e:
            choice(bad)
        assert "SPARE_" in str(e.value)


def test_the_benchs_process_identity_is_the_start_since_boot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's leftover check (procs.survivors) and its standby check (standbys.alive)
    know a process by its start since boot, as the daemon does (shell/kin.py): a wall-clock
    step, which moves psutil's create_time of every process, never makes a survivor look
    gone nor a live standby look replaced."""
    import psutil

    from bench.gpu import procs, standbys

    script = ("import subprocess, sys, time\n"
              # a lifetime, not a wait: its owner kills it; longer than wait_for's 60 s
              # scaled (x3), so a slow box never sees it end before the test looks
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']).wait()\n"
              "time.sleep(600)\n")  # it reaps its child: a kill leaves no zombie
    with owned([sys.executable, "-c", script]) as proc:
        wait_for(lambda: bool(procs.tree(proc.pid)), 60, "the grandchild")
        old = procs.tree(proc.pid)
        assert len(old) == 1, old
        born = standbys.created(proc.pid)
        real = psutil.Process.create_time
        monkeypatch.setattr(psutil.Process, "create_time",
                            lambda self: real(self) + 27.0)  # the CI box's 27 s step
        assert [s["pid"] for s in procs.survivors(old)] == [old[0][0]]
        assert standbys.alive(proc.pid, born)
        psutil.Process(old[0][0]).kill()
        wait_for(lambda: procs.survivors(old) == [], 60, "the killed grandchild gone")
