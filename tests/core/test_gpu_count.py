"""vllm.gpus that cannot hold one engine is refused at load: vLLM puts each tensor- and
pipeline-parallel rank on a GPU of its own, and `gpus = [0]` with `tensor-parallel-size = 2`
passed `check` and then failed every start (the hostile pass of 2026-12-07)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllmwatch.config.schema import ConfigError, from_dict


def _load(gpus: list[int] | None, args: dict[str, Any], extra: list[str]) -> str | None:
    vllm: dict[str, Any] = {"model": "/m", "args": args, "extra_args": extra}
    if gpus is not None:
        vllm["gpus"] = gpus
    try:
        from_dict({"vllm": vllm})
    except ConfigError as exc:
        return str(exc)
    return None


def _ways(tp: int, pp: int) -> list[tuple[dict[str, Any], list[str]]]:
    """The same sizes said in each way vLLM reads them."""
    return [({"tensor-parallel-size": tp, "pipeline-parallel-size": pp}, []),
            ({"tensor_parallel_size": tp}, ["--pipeline-parallel-size", str(pp)]),
            ({}, ["-tp", str(tp), f"--pipeline-parallel-size={pp}"]),
            ({"pipeline-parallel-size": pp}, [f"--tensor-parallel-size={tp}"])]


@given(tp=st.integers(1, 8), pp=st.integers(1, 4), dp=st.integers(1, 3),
       n=st.integers(1, 8), way=st.integers(0, 3))
def test_a_gpu_list_shorter_than_the_ranks_is_refused_naming_both(
        tp: int, pp: int, dp: int, n: int, way: int) -> None:
    args, extra = _ways(tp, pp)[way]
    extra = [*extra, "--data-parallel-size", str(dp)] if dp > 1 else extra
    said = _load(list(range(n)), args, extra)
    if tp * pp * dp <= n:
        assert said is None or "vllm.gpus" not in said, said
    else:
        assert said is not None and "vllm.gpus" in said, (tp, pp, dp, n, said)
        assert f"{n} GPU(s)" in said and f"= {tp * pp * dp} ranks" in said, said


@pytest.mark.parametrize("more", [
    ["--nnodes", "2"], ["-n", "2", "-r", "0"], ["--node-rank", "1"],
    ["--distributed-executor-backend", "ray"], ["--distributed-executor-backend",
                                                "external_launcher"],
    ["--data-parallel-size", "4", "--data-parallel-size-local", "1"],
    ["--data-parallel-size", "4", "--data-parallel-rank", "2"],
    ["--data-parallel-address", "10.0.0.1"], ["--headless"],
])
def test_a_deployment_over_more_nodes_is_left_to_vllm(more: list[str]) -> None:
    """A head of two nodes (gpus = 8 of its own, tensor-parallel-size = 16) loaded before,
    and vLLM runs it: the sizes count the other node's GPUs too (the review of 2026-12-07)."""
    said = _load(list(range(8)), {"tensor-parallel-size": 16}, more)
    assert said is None or "vllm.gpus" not in said, said


@pytest.mark.parametrize("backend", ["mp", "uni"])
def test_one_nodes_own_backends_are_still_judged(backend: str) -> None:
    said = _load([0], {"tensor-parallel-size": 2}, ["--distributed-executor-backend", backend])
    assert said is not None and "vllm.gpus" in said, said


@pytest.mark.parametrize("gpus", [None, []])
def test_every_gpu_or_a_cpu_config_is_not_judged_here(gpus: list[int] | None) -> None:
    # None: every GPU of the machine (check counts them); []: vLLM on CPU
    said = _load(gpus, {"tensor-parallel-size": 4}, [])
    assert said is None or "vllm.gpus" not in said, said
