"""The spare's plan (config/spare.py, issue 34 point 1): the H200 numbers of the issue, every
"off" with its reason and remedy, and the invariants over any machine (hypothesis)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllmwatch.config.schema import ConfigError, from_dict
from vllmwatch.config.sections import SpareConfig
from vllmwatch.config.spare import (
    OTHERS_FLOOR_MIB,
    SAFETY_MIB,
    SERVING_EXTRA_MIB,
    Footprint,
    SpareFacts,
    human_int,
    kv_bytes_per_token,
    plan_spare,
    spare_gpu,
    with_flags,
)

QWEN3_8B = {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "hidden_size": 4096, "torch_dtype": "bfloat16",
            "max_position_embeddings": 40960}
H200 = SpareFacts(gpu_total_mib=143771.0, host_available_mib=2_000_000.0, sleep_mode=True,
                  uds=True, weights_mib=16282.0, kv_bytes_per_token=147456,
                  model_max_len=40960, uds_path="/run/vllmwatch/spare.sock")
TRUE, AUTO = SpareConfig(enabled="true"), SpareConfig(enabled="auto")


def facts(**kw: object) -> SpareFacts:
    return dataclasses.replace(H200, **kw)  # type: ignore[arg-type]


def test_kv_bytes_per_token_of_qwen3_8b_and_other_layouts() -> None:
    assert kv_bytes_per_token(QWEN3_8B) == 36 * 8 * 128 * 2 * 2 == 147456
    assert kv_bytes_per_token(QWEN3_8B, "fp8_e4m3") == 147456 // 2
    assert kv_bytes_per_token({"text_config": QWEN3_8B}) == 147456
    mla = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
           "torch_dtype": "bfloat16"}
    assert kv_bytes_per_token(mla) == 61 * 576 * 2
    assert kv_bytes_per_token({**QWEN3_8B, "layer_types": ["sliding_attention"]}) is None
    assert kv_bytes_per_token({"hidden_size": 8}) is None


@pytest.mark.parametrize(("text", "want"), [("8G", 8 << 30), ("8g", 8 * 10**9), ("32k", 32000),
                                            ("32K", 32768), (4096, 4096), ("1.5K", None),
                                            ("auto", None), (True, None), ("9" * 400, None)])
def test_human_int_reads_like_vllm(text: object, want: int | None) -> None:
    assert human_int(text) == want


def test_h200_8b_true_lowers_090_to_078_estimated_and_measured() -> None:
    est = plan_spare(TRUE, True, {}, H200)
    assert est.on and (est.serving_before, est.serving_after) == (0.9, 0.78)
    assert est.serving_flags == {"gpu-memory-utilization": "0.78"}
    assert est.spare_flags == {"enable-sleep-mode": True, "gpu-memory-utilization": "0.192",
                               "kv-cache-memory-bytes": str(8 << 30),
                               "uds": "/run/vllmwatch/spare.sock"}
    assert est.spare_env == {"VLLM_SERVER_DEV_MODE": "1"}
    assert est.kv_tokens == (8 << 30) // 147456 and est.max_model_len == 40960
    assert 24 * 1024 < (est.host_needed_mib or 0) < 26 * 1024  # ~25 GiB for an 8B
    got = plan_spare(TRUE, True, {}, facts(measured=Footprint(27202, 1932), others_mib=673))
    assert got.on and got.serving_after == 0.78 and got.measured
    assert "0.9 -> 0.78" in "\n".join(got.lines())


def test_auto_is_off_at_090_and_says_the_value_on_at_078() -> None:
    off = plan_spare(AUTO, True, {}, H200)
    assert not off.on and "at most 0.78" in off.todo and "spare.enabled = true" in off.todo
    on = plan_spare(AUTO, True, {"gpu-memory-utilization": "0.78"}, H200)
    assert on.on and on.serving_flags == {} and on.serving_after == 0.78


@pytest.mark.parametrize(("spare", "gate", "flags", "kw", "words"), [
    (AUTO, False, {}, {}, "gate is off"),
    (AUTO, True, {}, {"platform": "cpu"}, "CPU"),
    (AUTO, True, {}, {"platform": "unified"}, "unified memory"),
    (AUTO, True, {"tensor-parallel-size": 2}, {}, "parallel size is 2"),
    (AUTO, True, {"pipeline-parallel-size": "2"}, {}, "parallel size is 2"),
    (TRUE, True, {}, {"sleep_mode": False}, "no --enable-sleep-mode"),
    (AUTO, True, {"gpu-memory-utilization": 0.5}, {"uds": False}, "no --uds"),
    (TRUE, True, {}, {"gpu_total_mib": None}, "total memory is unknown"),
    (TRUE, True, {}, {"weights_mib": None}, "weight size is unknown"),
    (TRUE, True, {"max-model-len": "128k"}, {}, "spare.kv_cache to at least \"18GiB\""),
    (TRUE, True, {}, {"host_available_mib": 20000.0}, "host memory"),
    (TRUE, True, {"gpu-memory-utilization": "lots"}, {}, "not a number"),
    (TRUE, True, {}, {"gpu_total_mib": 30000.0}, "no room"),
    (SpareConfig(enabled="true", utilization=0.1), True, {}, {}, "spare.utilization"),
    (SpareConfig(enabled="false"), True, {}, {}, "spare.enabled = false"),
])
def test_every_off_says_why_and_what_to_change(spare: SpareConfig, gate: bool,
                                               flags: dict[str, object],
                                               kw: dict[str, object], words: str) -> None:
    plan = plan_spare(spare, gate, flags, facts(**kw))
    assert not plan.on
    assert words in plan.reason + "; " + plan.todo
    assert plan.todo or spare.enabled == "false"
    assert plan.lines()[0].startswith("off: ")
    assert not plan.spare_flags and not plan.serving_flags


def test_true_without_uds_is_off_and_names_the_exposure() -> None:
    """`true` once took the exposure (the plan on, no --uds), but vllmwatch reaches the
    spare only on its socket: built without --uds it bound the serving command's --port and
    answered nothing there. Off, saying what the exposure would be and what to do."""
    plan = plan_spare(TRUE, True, {}, facts(uds=False))
    assert not plan.on and not plan.spare_flags and not plan.serving_flags
    assert "every local user" in plan.reason and "upgrade vLLM" in plan.todo


def test_true_where_the_config_rules_it_out_is_a_config_error() -> None:
    base = {"vllm": {"model": "/m"}, "spare": {"enabled": True}}
    with pytest.raises(ConfigError, match=r"spare\.enabled: is true but the gate is off"):
        from_dict(base)
    gate = {"enabled": True, "listen": "127.0.0.1:9999"}
    with pytest.raises(ConfigError, match="parallel size is 4"):
        from_dict({**base, "gate": gate, "vllm": {"model": "/m", "args": {
            "tensor_parallel_size": 4}}})
    with pytest.raises(ConfigError, match="parallel size is 2"):  # given in extra_args
        from_dict({**base, "gate": gate, "vllm": {"model": "/m", "extra_args": ["-tp", "2"]}})
    assert from_dict({**base, "gate": gate}).spare.enabled == "true"
    assert from_dict({"vllm": {"model": "/m"}}).spare == SpareConfig()  # auto, 8 GiB, 3


def test_with_flags_replaces_every_spelling_and_appends() -> None:
    argv = ["vllm", "serve", "/m", "--gpu_memory_utilization", "0.9", "--port=8001",
            "--enable-sleep-mode", "--kv-cache-memory-bytes=4G", "--enforce-eager"]
    got = with_flags(argv, {"gpu-memory-utilization": "0.2", "enable-sleep-mode": True,
                            "kv-cache-memory-bytes": "8", "port": None})
    assert got == ["vllm", "serve", "/m", "--enforce-eager", "--gpu-memory-utilization", "0.2",
                   "--enable-sleep-mode", "--kv-cache-memory-bytes", "8"]


FLAG_NAMES = ["gpu-memory-utilization", "gpu_memory_utilization", "enable-sleep-mode", "port",
              "uds", "kv-cache-memory-bytes", "enforce-eager"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(FLAG_NAMES).map(lambda n: "--" + n),
                          st.sampled_from(FLAG_NAMES).map(lambda n: f"--{n}=1"),
                          st.sampled_from(["0.9", "x", "/m", "8001"])), max_size=12),
       st.dictionaries(st.sampled_from(FLAG_NAMES[2:]),
                       st.one_of(st.just(True), st.just(None), st.sampled_from(["1", "a"])),
                       max_size=4))
def test_with_flags_sets_each_flag_once(argv: list[str],
                                        changes: dict[str, str | bool | None]) -> None:
    got = with_flags(argv, changes)
    for name, value in changes.items():
        spelled = [t for t in got if t.split("=")[0].replace("_", "-") == f"--{name}"]
        assert len(spelled) == (0 if value is None else 1), (got, name)
        if isinstance(value, str):
            assert got[got.index(f"--{name}") + 1] == value
    assert with_flags(got, changes) == got  # applying twice changes nothing more


FACTS = st.builds(
    SpareFacts,
    platform=st.sampled_from(["discrete", "discrete", "discrete", "unified", "cpu"]),
    gpu_total_mib=st.one_of(st.none(), st.floats(1000, 300_000)),
    others_mib=st.one_of(st.none(), st.floats(0, 20_000)),
    host_available_mib=st.one_of(st.none(), st.floats(0, 2_000_000)),
    sleep_mode=st.sampled_from([True, True, None, False]),
    uds=st.sampled_from([True, True, None, False]),
    weights_mib=st.one_of(st.none(), st.floats(100, 200_000)),
    kv_bytes_per_token=st.one_of(st.none(), st.integers(1, 2_000_000)),
    model_max_len=st.one_of(st.none(), st.integers(1, 1_000_000)),
    uds_path=st.just("/run/x/spare.sock"),
    measured=st.one_of(st.none(), st.builds(Footprint, st.floats(500, 150_000),
                                            st.floats(0, 5_000))))
SPARES = st.builds(SpareConfig, enabled=st.sampled_from(["auto", "true", "false"]),
                   kv_cache=st.floats(64, 100_000),
                   utilization=st.one_of(st.just(0.0), st.floats(0.01, 0.5)))
FLAGS = st.fixed_dictionaries({}, optional={
    "gpu-memory-utilization": st.one_of(st.floats(0.05, 0.99), st.sampled_from(["0.9", "x"])),
    "tensor-parallel-size": st.integers(1, 4), "max-model-len": st.integers(1, 500_000)})


@settings(max_examples=600, deadline=None)
@given(SPARES, st.booleans(), FLAGS, FACTS)
def test_plan_invariants(spare: SpareConfig, gate: bool, flags: dict[str, object],
                         f: SpareFacts) -> None:
    plan = plan_spare(spare, gate, flags, f)
    if not plan.on:  # off: always a reason, and what to change unless the operator said so
        assert plan.reason and (plan.todo or spare.enabled == "false")
        assert not plan.spare_flags and not plan.serving_flags
        return
    total = f.gpu_total_mib
    assert total is not None and gate and f.platform == "discrete" and f.sleep_mode is not False
    assert plan.serving_before is not None and plan.serving_after is not None
    assert plan.spare_utilization is not None and plan.awake_mib is not None
    # auto never changes what the operator asked vLLM to serve; true never raises it
    if spare.enabled == "auto":
        assert plan.serving_flags == {} and plan.serving_after == plan.serving_before
        assert f.uds is not False
    assert plan.serving_after <= plan.serving_before
    # the spare's budget covers its footprint, and spare + serving fit the device total
    # (a measured spare larger than its budget is met by the room the serving engine leaves)
    room = max(plan.spare_utilization * total, plan.awake_mib)
    if f.measured is None:
        assert plan.spare_utilization * total >= plan.awake_mib
    others = max(f.others_mib or 0.0, OTHERS_FLOOR_MIB)
    assert room + plan.serving_after * total + SERVING_EXTRA_MIB + \
        others + SAFETY_MIB <= total + 1e-6
    # one request of max-model-len fits the spare's KV; the host holds its backup
    if plan.kv_tokens is not None and plan.max_model_len is not None:
        assert plan.kv_tokens >= plan.max_model_len
    if f.host_available_mib is not None:
        assert (plan.host_needed_mib or 0) <= f.host_available_mib
    assert plan.spare_flags["enable-sleep-mode"] is True
    assert plan.spare_env == {"VLLM_SERVER_DEV_MODE": "1"}


@settings(max_examples=1500, deadline=None)
@given(SPARES, FLAGS, FACTS, st.builds(Footprint, st.floats(500, 150_000), st.floats(0, 5_000)))
def test_a_measurement_never_moves_the_spares_command_nor_loosens_the_room(
        spare: SpareConfig, flags: dict[str, object], f: SpareFacts, got: Footprint) -> None:
    """The daemon plans again with the first build's measured footprint: the spare's flags
    stay those it was built with (a reload compares them), and the serving engine is never
    given more than the estimate gave it (the room is the larger of budget and measure)."""
    f = dataclasses.replace(f, measured=None)
    est = plan_spare(spare, True, flags, f)
    if not est.on or f.weights_mib is None:
        return  # a spare the estimate kept off is never built, so never measured
    measured = plan_spare(spare, True, flags, dataclasses.replace(f, measured=got))
    if not measured.on:
        return  # (a spare larger than planned may leave no room: the plan says why)
    assert dict(measured.spare_flags) == dict(est.spare_flags)
    assert measured.spare_utilization == est.spare_utilization
    assert measured.serving_after is not None and est.serving_after is not None
    assert measured.serving_after <= est.serving_after
    assert (measured.awake_mib, measured.asleep_mib) == (got.awake_mib, got.asleep_mib)

# ---- the spare's GPU (issue 34 leftover 2: a reload may change vllm.gpus) ----


@given(st.one_of(st.none(), st.lists(st.integers(0, 7), max_size=3)),
       st.sets(st.integers(0, 7), max_size=4))
def test_the_spares_gpu_is_the_configs_first_else_the_first_nvml_shows(
        gpus: list[int] | None, seen: set[int]) -> None:
    got = spare_gpu(gpus, seen)
    if gpus:
        assert got == gpus[0]
    else:
        assert got == (min(seen) if seen else None)


@pytest.mark.parametrize(("gpus", "seen", "gpu"), [
    ([1], {0, 1}, 1), ([0], {0, 1}, 0), (None, {2, 3}, 2), ([], {0}, 0), (None, set(), None),
    ([3], {0}, 3),  # a GPU the sampler does not watch: its figures are unknown, never GPU 0's
])
def test_spare_gpu_table(gpus: list[int] | None, seen: set[int], gpu: int | None) -> None:
    assert spare_gpu(gpus, seen) == gpu


# ---- a spare turned on by a reload (issue 34 leftover 4): a restart key unless planned ----

SPARES = st.builds(SpareConfig, enabled=st.sampled_from(["auto", "true", "false"]),
                   kv_cache=st.sampled_from([4096.0, 8192.0]), retries=st.sampled_from([1, 3]))


@given(SPARES, SPARES, st.booleans(), st.booleans())
def test_spare_keys_need_a_restart_only_when_no_spare_was_planned_and_it_would_be_now(
        started: SpareConfig, new: SpareConfig, gate: bool, planned: bool) -> None:
    keys = started.restart_keys(new, gate, planned)
    if planned or not new.considered(gate):
        assert keys == ()  # a planned spare follows every reload; an off one stays off
    else:
        assert keys == tuple(f"spare.{k}" for k in ("enabled", "kv_cache", "retries")
                             if getattr(started, k) != getattr(new, k))


def test_spare_restart_keys_table() -> None:
    off, on = SpareConfig(enabled="false"), TRUE
    assert off.restart_keys(on, False, planned=False) == ("spare.enabled",)
    assert off.restart_keys(AUTO, True, planned=False) == ("spare.enabled",)
    assert off.restart_keys(AUTO, False, planned=False) == ()  # auto with the gate off: off
    assert on.restart_keys(off, True, planned=True) == ()  # turned off live
    assert AUTO.restart_keys(AUTO, True, planned=False) == ()  # nothing changed
