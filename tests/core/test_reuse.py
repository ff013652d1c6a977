"""What a launch reused of vLLM's start-up caches (issue 33), read from vLLM's own lines.

Fixtures are verbatim: vLLM 0.26.0 on the H200 (docs/gpu/h200-round5/call2-logs.tar.gz,
logs/standby-vllmwatch.log: the cold start of EngineCore pid 923, then the standby relaunch
pid 1325), the startup plan's lines as vLLM's `v1/worker/startup_plan.py` formats them (with
the 0.26 prefix and the KV size of issue 33's run), and vLLM 0.32.0 (the CPU build) as run
on this machine: bench/results/logs/startup-compile-cold-0.jsonl and -warm-1.jsonl (the
compile-cache bench of 2026-11-29, docs/BENCHMARKS.md).
"""

from __future__ import annotations

import pytest

from vllmwatch.core import reuse

P = "(EngineCore pid=923) INFO 12-01 20:46:26 "
V026_COLD = [
    "(EngineCore pid=923) INFO 12-01 20:46:26 [default_loader.py:430] Loading weights took "
    "2.21 seconds",
    "(EngineCore pid=923) INFO 12-01 20:46:55 [decorators.py:708] saved AOT compiled function "
    "to /tmp/vllm_h200/cache8b-standby/vllm/torch_compile_cache/torch_aot_compile/67148a638f0c"
    "962b407b762c9b52895965c632b4b315267006a00187adf8aeea/rank_0_0/model",
    "(EngineCore pid=923) INFO 12-01 20:46:55 [monitor.py:53] torch.compile took 28.48 s in "
    "total",
    "(EngineCore pid=923) INFO 12-01 20:47:05 [model_runner.py:747] Graph capturing finished "
    "in 4 secs, took 1.00 GiB",
    "(EngineCore pid=923) INFO 12-01 20:47:19 [core.py:340] init engine (profile, create kv "
    "cache, warmup model) took 52.05 s (compilation: 28.48 s)",
]
V026_WARM = [
    "(EngineCore pid=1325) INFO 12-01 20:47:46 [default_loader.py:430] Loading weights took "
    "2.00 seconds",
    "(EngineCore pid=1325) INFO 12-01 20:47:52 [backends.py:292] Directly load the compiled "
    "graph(s) for compile range (1, 8192) from the cache, took 1.782 s",
    "(EngineCore pid=1325) INFO 12-01 20:47:52 [decorators.py:311] Directly load AOT "
    "compilation from path /tmp/vllm_h200/cache8b-standby/vllm/torch_compile_cache/torch_aot_"
    "compile/67148a638f0c962b407b762c9b52895965c632b4b315267006a00187adf8aeea/rank_0_0/model",
    "(EngineCore pid=1325) INFO 12-01 20:47:52 [monitor.py:53] torch.compile took 5.03 s in "
    "total",
    "(EngineCore pid=1325) INFO 12-01 20:47:57 [model_runner.py:747] Graph capturing finished "
    "in 4 secs, took 1.00 GiB",
    "(EngineCore pid=1325) INFO 12-01 20:47:58 [core.py:340] init engine (profile, create kv "
    "cache, warmup model) took 11.49 s (compilation: 5.03 s)",
]
# vLLM's format strings (v1/worker/startup_plan.py), filled as on the H200 (KV 108.4 GiB).
PLAN_SAVED = (P + "[startup_plan.py:175] Saved startup plan to /tmp/vllm_h200/cache8b-caches/"
              "vllm/startup_plan/startup_plan_3f9a0c1d2b4e5f60.json")
PLAN_APPLIED = (P + "[startup_plan.py:150] Applying persisted startup plan (fingerprint "
                "3f9a0c1d2b4e5f60): kv_cache_memory_bytes=116391570944 (108.40 GiB), "
                "recorded free-memory baseline 139.29 GiB, current 139.29 GiB. Memory "
                "profiling will be skipped.")
PLAN_NOT = (P + "[startup_plan.py:128] Startup plan not applied: current free memory (120.10 "
            "GiB) is below the recorded baseline (139.29 GiB); falling back to full memory "
            "profiling.")
AOT_ERROR_032 = ("(EngineCore pid=7) WARNING 12-02 06:40:00 [decorators.py:333] Compiling "
                 "model again due to a load failure from /c/model, reason: Compile cache "
                 "file corrupted.")  # vLLM 0.32's format string (compilation/decorators.py)
AOT_ERROR = (P + "[decorators.py:300] Cannot load aot compilation from path /c/model, error: "
             "Source code has changed since the last compilation. Recompiling the model.")


V032_COLD = [
    "(Worker pid=11735) INFO 11-29 18:30:01 [default_loader.py:501] Loading weights took 0.01 "
    "seconds",
    "(Worker pid=11735) INFO 11-29 18:31:13 [decorators.py:743] [backbone] saved AOT compiled "
    "function to /tmp/vw-startup-caches-6x9u4rd6/compile-0/vllm/torch_compile_cache/torch_aot_"
    "compile/f39a0a2caf5d225861d82f68764c6919bdd7f4ee651e4a21ff7df9fe3cb63c91/rank_0_0/model",
    "(EngineCore pid=11703) INFO 11-29 18:31:15 [core.py:402] init engine (profile, create kv "
    "cache, warmup model) took 70.33 s",
]
V032_WARM = [
    "(Worker pid=15189) INFO 11-29 18:36:53 [default_loader.py:501] Loading weights took 0.01 "
    "seconds",
    "(Worker pid=15189) WARNING 11-29 18:37:00 [decorators.py:333] [backbone] Compiling model "
    "again due to a load failure from /tmp/vw-startup-caches-6x9u4rd6/compile-1/vllm/torch_"
    "compile_cache/torch_aot_compile/f39a0a2caf5d225861d82f68764c6919bdd7f4ee651e4a21ff7df9fe"
    "3cb63c91/rank_0_0/model, reason: 'function' object has no attribute 'finalize_loading'",
    "(Worker pid=15189) INFO 11-29 18:37:23 [decorators.py:743] [backbone] saved AOT compiled "
    "function to /tmp/vw-startup-caches-6x9u4rd6/compile-1/vllm/torch_compile_cache/torch_aot_"
    "compile/f39a0a2caf5d225861d82f68764c6919bdd7f4ee651e4a21ff7df9fe3cb63c91/rank_0_0/model",
    "(EngineCore pid=15159) INFO 11-29 18:37:27 [core.py:402] init engine (profile, create kv "
    "cache, warmup model) took 32.42 s",
]


def read(lines: list[str]) -> tuple[dict[str, object], bool]:
    facts: dict[str, object] = {}
    hit = False
    for line in lines:
        facts = reuse.merge(facts, reuse.facts_of(line))
        hit = hit or "Directly load the compiled graph(s)" in line
    return facts, hit


def test_026_cold_start_writes_and_says_its_seconds() -> None:
    facts, hit = read(V026_COLD)
    assert facts == {"weights_s": 2.21, "aot_saved": True, "compile_s": 28.48, "graphs_s": 4.0,
                     "engine_init_s": 52.05}
    assert not hit
    assert reuse.one_line(facts, hit) == ("compile cache miss, AOT artifact written; weights "
                                          "2.21 s, torch.compile 28.48 s, CUDA graphs 4 s, "
                                          "engine init 52.05 s")


def test_026_warm_start_loads_the_aot_artifact() -> None:
    facts, hit = read(V026_WARM)
    assert facts["aot_loaded"] is True and hit
    assert facts["compile_s"] == 5.03 and facts["graphs_s"] == 4.0 and facts["weights_s"] == 2.0
    assert reuse.hits(facts, hit) == {"compile_cache": True, "aot_artifact": True,
                                      "startup_plan": False}


def test_the_startup_plan_written_applied_and_refused() -> None:
    assert read([PLAN_SAVED])[0] == {"startup_plan": "saved"}
    applied = read([PLAN_APPLIED])[0]
    assert applied == {"startup_plan": "applied", "startup_plan_kv_bytes": 116391570944}
    assert "startup plan applied (KV 108.4 GiB)" in reuse.one_line(applied, True)
    refused = read([PLAN_NOT])[0]
    assert refused["startup_plan"] == "not_applied"
    assert str(refused["startup_plan_why"]).startswith("Startup plan not applied: current free")


def test_with_several_workers_one_refusal_is_a_miss_and_the_slowest_rank_counts() -> None:
    facts = read([PLAN_NOT, PLAN_APPLIED, P + "[monitor.py:53] torch.compile took 3.00 s in "
                  "total", P + "[monitor.py:53] torch.compile took 2.00 s in total"])[0]
    assert facts["startup_plan"] == "not_applied" and facts["compile_s"] == 3.0


@pytest.mark.parametrize("line", [
    "(APIServer pid=1) INFO 12-01 20:47:29 [loggers.py:310] Engine 000: Avg prompt throughput: "
    "97.7 tokens/s, Avg generation throughput: 4.3 tokens/s, Running: 0 reqs",
    P + "[gpu_worker.py:560] Available KV cache memory: 109.04 GiB",
    P + "[model_runner.py:305] Model loading took 15.27 GiB and 3.858255 seconds",
    "(APIServer pid=1) INFO:     127.0.0.1:39006 - \"POST /v1/completions HTTP/1.1\" 200 OK",
])
def test_other_lines_state_nothing(line: str) -> None:
    assert reuse.facts_of(line) == ()


def causes(missed: list[tuple[str, str, bool]]) -> dict[str, str]:
    """{cache: likely cause} of reuse.misses, for the misses no reload explains."""
    assert not [m for m in missed if m[2]], "no config changed here: no miss is expected"
    return {cache: why for cache, why, _ in missed}


def test_a_miss_after_a_hit_names_the_cache_and_vllms_reason() -> None:
    before = reuse.hits(read([*V026_WARM, PLAN_APPLIED])[0], True)
    facts, hit = read([PLAN_NOT, AOT_ERROR])
    missed = causes(reuse.misses(before, reuse.hits(facts, hit), facts))
    assert set(missed) == {"compile_cache", "aot_artifact", "startup_plan"}
    assert missed["startup_plan"].startswith("vLLM said: Startup plan not applied")
    assert "Source code has changed" in missed["aot_artifact"]
    # a cache that never hit cannot be missed; nothing hit before: nothing to say
    assert reuse.misses({}, reuse.hits(facts, hit), facts) == []
    assert reuse.misses(before, before, facts) == []


def test_032_cpu_cold_start_writes_the_artifact() -> None:
    facts, hit = read(V032_COLD)
    assert facts == {"weights_s": 0.01, "aot_saved": True, "engine_init_s": 70.33}
    assert reuse.hits(facts, hit) == {"compile_cache": False, "aot_artifact": False,
                                      "startup_plan": False}


def test_032_cpu_warm_start_could_not_load_it_and_says_why() -> None:
    # vLLM 0.32's CPU build (torch 2.13: the mega artifact is its default) fails to load its
    # own artifact and compiles again: no hit, and vLLM's reason is kept for a miss warning.
    facts, hit = read(V032_WARM)
    assert facts["aot_error"] == "'function' object has no attribute 'finalize_loading'"
    assert facts["aot_saved"] is True and "aot_loaded" not in facts and not hit
    missed = causes(reuse.misses({"aot_artifact": True}, reuse.hits(facts, hit), facts))
    assert missed == {"aot_artifact": "vLLM said: 'function' object has no attribute "
                                      "'finalize_loading'"}


def test_032_aot_load_failure_is_the_reason() -> None:
    assert read([AOT_ERROR_032])[0] == {"aot_error": "Compile cache file corrupted."}


def test_a_miss_without_vllms_reason_gives_the_likely_cause() -> None:
    missed = causes(reuse.misses({"startup_plan": True}, {"startup_plan": False}, {}))
    assert "plan file was removed" in missed["startup_plan"]


# Tensor parallel: each worker loads its own artifact (rank_0_0, rank_1_0); vLLM 0.32's format
# strings (compilation/decorators.py), one rank's file corrupted.
TP_LOADED = ("(Worker_TP0 pid=10) INFO 12-02 06:40:00 [decorators.py:320] Directly load AOT "
             "compilation from path /c/vllm/torch_compile_cache/torch_aot_compile/ab/rank_0_0/"
             "model")
TP_FAILED = ("(Worker_TP1 pid=11) WARNING 12-02 06:40:00 [decorators.py:333] Compiling model "
             "again due to a load failure from /c/vllm/torch_compile_cache/torch_aot_compile/ab/"
             "rank_1_0/model, reason: Compile cache file corrupted.")


@pytest.mark.parametrize("lines", [[TP_LOADED, TP_FAILED], [TP_FAILED, TP_LOADED]])
def test_one_worker_that_compiled_again_is_an_aot_miss(lines: list[str]) -> None:
    # The launch compiled again on that worker (its torch.compile seconds): "AOT artifact
    # loaded" and no cache_missed warning hid it, in either order of the workers' lines.
    facts, hit = read([TP_LOADED, TP_LOADED.replace("rank_0_0", "rank_1_0")])
    before = reuse.hits(facts, hit)
    assert before["aot_artifact"] and "AOT artifact loaded;" in reuse.one_line(facts, hit) + ";"
    facts, hit = read(lines)
    now = reuse.hits(facts, hit)
    assert not now["aot_artifact"]
    assert "AOT artifact partly loaded (the rest compiled again)" in reuse.one_line(facts, hit)
    logs = reuse.missed_logs(before, {}, now, facts, {}, awake=False)
    assert [(g.level, g.event, g.fields["cache"], g.fields["likely_cause"]) for g in logs] == [
        ("warning", "startup.cache_missed", "aot_artifact",
         "vLLM said: Compile cache file corrupted.")]


# vLLM 0.32's format strings (compilation/monitor.py, v1/engine/core.py): with speculative
# decoding each worker compiles two parts, and the engine line says their sum (the slowest
# worker's); a multimodal model adds its encoder's.
SPEC = [P + "[monitor.py:63] [backbone] torch.compile took 20.00 s in total",
        P + "[monitor.py:63] [eagle_head] torch.compile took 3.00 s in total",
        P + "[core.py:396] init engine (profile, create kv cache, warmup model) took 40.00 s "
        "(compilation: 23.00 s)"]
ENCODER = [P + "[monitor.py:63] torch.compile took 10.00 s in total",
           P + "[monitor.py:63] [SiglipVisionModel] torch.compile took 2.50 s in total",
           P + "[core.py:386] init engine (profile, create kv cache, warmup model) took 30.00 s "
           "(compilation: 12.50 s \u2014 language_model: 10.00 s, encoder: 2.50 s)"]


@pytest.mark.parametrize(("lines", "total"), [(SPEC, 23.0), (ENCODER, 12.5)])
def test_torch_compile_seconds_are_the_launchs_not_one_parts(lines: list[str],
                                                             total: float) -> None:
    # The largest part's seconds were reported as the launch's torch.compile (20 s of 23 s).
    facts = read(lines)[0]
    assert facts["compile_s"] == total and facts["engine_init_s"] in (40.0, 30.0)
    assert f"torch.compile {total:g} s" in reuse.one_line(facts, False)
    # the engine line seen before a part's (lines of two processes): still the total
    assert read([lines[-1], *lines[:-1]])[0]["compile_s"] == total
