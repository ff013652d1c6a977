"""Issue 24's pure rules: the canary's derived timeout, the verdict on a timeout, the host's
CPU pressure, the frozen engine; and issue 23 §2's check of a canary's 200 body per kind."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllmwatch.config.schema import ProbeConfig
from vllmwatch.core import canary, hangs, policy
from vllmwatch.core.hangs import HostCpu, Verdict
from vllmwatch.shell.probes import psi_some_avg10

P = ProbeConfig()  # the shipped defaults: floor 2 s, margin 4, ceiling 30 s


@pytest.mark.parametrize(("history", "expected"), [
    ((), 30.0),  # nothing known yet (the start): the ceiling
    ((0.03,) * 32, 2.0),  # an idle H200: 4 x 30 ms is below the floor
    ((1.0,) * 32, 4.0),  # a loaded engine: 4 x its 95th percentile
    ((10.0,) * 32, 30.0),  # never past the ceiling
    ((0.03,) * 31 + (20.0,), 2.0),  # one outlier in 32 is not the 95th percentile
    ((0.03,) * 30 + (5.0, 5.0), 20.0),  # two are
    ((9.0,) + (0.5,) * 32, 2.0),  # only the last 32 count
])
def test_the_canary_timeout_follows_this_runs_latencies(history: tuple[float, ...],
                                                        expected: float) -> None:
    assert hangs.canary_timeout(P, history) == pytest.approx(expected)


def test_a_ceiling_below_the_floor_fixes_the_timeout() -> None:
    old = ProbeConfig(canary_timeout=1.0)  # configs from before issue 24
    assert hangs.canary_timeout(old, (0.01,) * 32) == 1.0
    assert hangs.retry_timeout(old, 1.0, starved=True) == 1.0


@pytest.mark.parametrize(("after", "starved", "expected"), [
    (2.0, False, 4.0), (2.0, True, 8.0), (20.0, False, 30.0), (0.1, False, 2.0)])
def test_a_retry_gets_more_time_and_more_on_a_starved_host(after: float, starved: bool,
                                                          expected: float) -> None:
    assert hangs.retry_timeout(P, after, starved) == expected


@pytest.mark.parametrize(("moved", "retried", "verdict"), [
    (True, False, Verdict.BUSY), (True, True, Verdict.BUSY),  # tokens flow: never a hang
    (False, False, Verdict.RETRY),  # one timeout is not proof
    (False, True, Verdict.HANG)])
def test_the_verdict_on_a_canary_timeout(moved: bool, retried: bool, verdict: Verdict) -> None:
    assert hangs.on_timeout(moved, retried) == verdict


@given(st.booleans())
def test_no_hang_verdict_while_tokens_advance(retried: bool) -> None:
    assert hangs.on_timeout(True, retried) != Verdict.HANG


@pytest.mark.parametrize(("cpu", "starved"), [
    (None, False), (HostCpu(), False), (HostCpu(99.5, 0.1), True), (HostCpu(10.0, 5.0), False),
    (HostCpu(None, 1.0), True), (HostCpu(None, 0.6), False), (HostCpu(40.0, None), True)])
def test_a_saturated_host(cpu: HostCpu | None, starved: bool) -> None:
    assert hangs.saturated(cpu) is starved  # PSI wins over the load average when present
    assert hangs.frozen_limit(P, cpu) == (24.0 if starved else 8.0)


@pytest.mark.parametrize(("text", "value"), [
    ("some avg10=99.55 avg60=87.19 avg300=38.29 total=149492052\n"
     "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 99.55),
    ("full avg10=3.00 avg60=0.00 avg300=0.00 total=0\n", None), ("", None),
    ("some avg10=x\n", None)])
def test_psi_is_read_from_the_some_line(text: str, value: float | None) -> None:
    assert psi_some_avg10(text) == value


def _p(at: float, running: float, waiting: float, tokens: float, kv: float = 0.1
       ) -> policy.Progress:
    return policy.Progress(at, running, waiting, tokens, kv)


@pytest.mark.parametrize(("prev", "cur", "since", "frozen"), [
    (_p(0, 4, 10, 100), _p(2, 4, 10, 100), None, 0.0),  # queue up, nothing moves: frozen
    (_p(0, 4, 10, 100), _p(2, 4, 10, 100), -4.0, -4.0),  # ... and stays frozen since then
    (_p(0, 4, 10, 100), _p(2, 4, 10, 101), -4.0, None),  # a token: not frozen
    (_p(0, 1, 0, 100, 0.2), _p(2, 1, 0, 100, 0.3), None, None),  # a long prefill fills KV
    (_p(0, 4, 10, 100), _p(2, 4, 11, 100), None, None),  # the scheduler queued one more
    (_p(0, 0, 0, 100), _p(2, 0, 0, 100), None, None),  # idle: the canary's business
    (None, _p(2, 4, 10, 100), None, None)])
def test_a_frozen_engine(prev: policy.Progress | None, cur: policy.Progress,
                         since: float | None, frozen: float | None) -> None:
    assert policy.frozen_since(since, prev, cur) == frozen


@given(st.floats(0, 1e9), st.floats(0.001, 1e6), st.floats(0, 256), st.floats(0, 1e4))
def test_counters_that_advance_are_never_frozen(tokens: float, more: float, running: float,
                                                waiting: float) -> None:
    prev, cur = _p(0, running, waiting, tokens), _p(2, running, waiting, tokens + more)
    assert policy.advanced(prev, cur) or tokens + more == tokens  # float absorption only
    if tokens + more > tokens:
        assert policy.frozen_since(None, prev, cur) is None


# ---- issue 23 §2: a 200 counts only with the answer its kind promises ----

def _j(value: object) -> bytes:
    return json.dumps(value).encode()


GOOD = {
    "completions": _j({"choices": [{"text": "", "index": 0}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1}}),
    "chat": _j({"choices": [{"message": {"role": "assistant", "content": ""}}],
                "usage": {"completion_tokens": 1}}),
    "embeddings": _j({"data": [{"index": 0, "embedding": [0.1]}]}),
    "score": _j({"data": [{"index": 0, "score": 0.5}]}),
    "rerank": _j({"results": [{"index": 0, "relevance_score": 0.5}]}),
    "classify": _j({"data": [{"index": 0, "label": "a", "probs": [1.0]}]}),
    "pooling": _j({"data": [{"index": 0, "data": [0.1]}]}),
    "custom": _j({"anything": True}),
}
BAD = {  # for every kind: HTML, empty, an empty object, a list, an empty list of answers
    "html": b"<html><body>It works!</body></html>", "empty": b"", "object": b"{}",
    "list": b"[]", "error": _j({"object": "error", "message": "x"})}


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_every_kind_accepts_its_answer(kind: str) -> None:
    assert canary.answer_problem(kind, GOOD[kind]) == ""


@pytest.mark.parametrize("kind", sorted(set(GOOD) - {"custom"}))
@pytest.mark.parametrize("bad", sorted(BAD))
def test_every_kind_refuses_what_is_not_its_answer(kind: str, bad: str) -> None:
    assert canary.answer_problem(kind, BAD[bad]) != ""


@pytest.mark.parametrize("bad", ["html", "empty"])
def test_custom_needs_json_at_least(bad: str) -> None:
    assert "not JSON" in canary.answer_problem("custom", BAD[bad])


@pytest.mark.parametrize("kind", ["completions", "chat"])
@pytest.mark.parametrize("usage", [None, {}, {"completion_tokens": 0},
                                   {"completion_tokens": "1"}, {"completion_tokens": True}])
def test_a_generative_answer_must_have_generated_a_token(kind: str, usage: object) -> None:
    body = json.loads(GOOD[kind])
    body["usage"] = usage
    assert "completion_tokens" in canary.answer_problem(kind, _j(body))


@pytest.mark.parametrize("kind", ["embeddings", "rerank"])
def test_the_answer_list_of_the_wrong_kind_is_refused(kind: str) -> None:
    other = GOOD["rerank" if kind == "embeddings" else "embeddings"]
    assert canary.answer_problem(kind, other) != ""


@pytest.mark.parametrize(("before", "after", "moved"), [
    (_p(0, 4, 10, 100), _p(2, 4, 10, 101), True),  # a token
    (_p(0, 1, 0, 100, 0.20), _p(2, 1, 0, 100, 0.25), True),  # a prefill chunk, no token yet
    (_p(0, 4, 10, 100), _p(2, 3, 10, 100), True),  # the queue changed
    (_p(0, 4, 10, 100), _p(2, 4, 10, 100), False),  # frozen
    (_p(0, 0, 0, 100), _p(2, 0, 0, 100), False),  # idle and still
    (None, _p(2, 4, 10, 100), False)])
def test_what_counts_as_the_engine_moving(before: policy.Progress | None,
                                          after: policy.Progress, moved: bool) -> None:
    assert policy.moved(before, after) is moved


@pytest.mark.parametrize(("moved", "retried", "busy_for", "verdict"), [
    (True, False, 0.0, Verdict.BUSY),  # busy excuses a slow canary ...
    (True, True, 599.0, Verdict.BUSY),  # ... for a bounded time (probe.busy_timeout 600 s)
    (True, False, 600.0, Verdict.HANG),  # ... never for ever: counters are not trusted past it
    (True, True, 3600.0, Verdict.HANG),
    (False, False, 9999.0, Verdict.RETRY),  # nothing moved: the retry rule, as before
    (False, True, 0.0, Verdict.HANG)])
def test_busy_is_bounded(moved: bool, retried: bool, busy_for: float, verdict: Verdict) -> None:
    assert hangs.on_timeout(moved, retried, busy_for, 600.0) == verdict


def test_the_busy_bound_is_a_validated_config_key() -> None:
    from vllmwatch.config.errors import ConfigError
    from vllmwatch.config.schema import from_dict

    base = {"vllm": {"model": "/m", "gpus": []}}
    assert from_dict(base).probe.busy_timeout == 600.0
    assert from_dict({**base, "probe": {"busy_timeout": "90s"}}).probe.busy_timeout == 90.0
    for bad in ("0s", "forever", "2h"):  # never off, never for ever
        with pytest.raises(ConfigError, match="busy_timeout"):
            from_dict({**base, "probe": {"busy_timeout": bad}})
