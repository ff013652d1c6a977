"""An audio transcription or translation that vLLM aborted as it stopped is sent to the next
engine, like an aborted completion (gate/aborted.py). vLLM 0.32 answers such a request as a
finished transcription (speech_to_text/base/serving.py: the abort output's text joined as
any other): not streamed, a 200 whose `text` is empty and that has no finish_reason at all;
streamed, an event with an empty delta and `"finish_reason":"abort"`, then `data: [DONE]`.
Before, the client got the empty transcription as a success across every planned restart
that reached its request (the gate read aborts of completions only).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.shell import test_gate_replay as scripted
from tests.shell.test_gate_aborted import DONE, _planned_stop_with_one_in_flight
from tests.shell.test_gate_replay import in_thread, post, relaunch_when_tried, settle
from tests.support import TIMEOUT_SCALE, wait_until
from vllmwatch.gate import aborted

TRANSCRIPTIONS, TRANSLATIONS = "/v1/audio/transcriptions", "/v1/audio/translations"
# TranscriptionResponse(text=..., usage=...).model_dump(), as its api_router answers it
EMPTY = json.dumps({"text": "", "usage": {"type": "duration", "seconds": 3}}).encode()
HEARD = json.dumps({"text": " Hello there.", "usage": {"type": "duration",
                                                       "seconds": 3}}).encode()
EMPTY_TRANSLATION, HEARD_TRANSLATION = b'{"text":""}', b'{"text":" Hello there."}'
# A stream's events (model_dump_json(exclude_unset=True)): the abort has an empty delta
ABORT = (b'data: {"id":"trsc-1","object":"transcription.chunk","created":1,"model":"w",'
         b'"choices":[{"delta":{"content":""},"finish_reason":"abort","stop_reason":null}]}\n\n')
TOKEN = (b'data: {"id":"trsc-1","object":"transcription.chunk","created":1,"model":"w",'
         b'"choices":[{"delta":{"content":" Hello"}}]}\n\n')
AUDIO = {"model": "w", "file": "(the gate forwards the multipart body as it came)"}


@pytest.mark.parametrize(("path", "empty", "heard"), [
    (TRANSCRIPTIONS, EMPTY, HEARD), (TRANSLATIONS, EMPTY_TRANSLATION, HEARD_TRANSLATION)])
def test_an_empty_transcription_of_an_engine_told_to_stop_goes_to_the_next_engine(
        path: str, empty: bytes, heard: bytes) -> None:
    with scripted.setup(("later", (200, empty)), (200, heard)) as (g, script, d):
        out, t = in_thread(lambda: post(g.port, path, AUDIO))
        _planned_stop_with_one_in_flight(g, script, d, t)
        assert out == [(200, heard)]
        assert [gen for _, gen in script.seen] == [1, 2]
        assert dict(g.events)["gate.replayed"]["failure"] == "aborted"  # type: ignore[attr-defined]
        assert g.forwarder.suspects.idle()  # a stop is no death: nothing held


def test_an_aborted_transcription_stream_goes_to_the_next_engine() -> None:
    with scripted.setup(("stream", [ABORT, DONE], "end"), (200, HEARD)) as (g, script, d):
        out, t = in_thread(lambda: post(g.port, TRANSCRIPTIONS, {**AUDIO, "stream": True}))
        relaunch_when_tried(g, script, d)
        t.join(30 * TIMEOUT_SCALE)
        settle(g)
        assert out == [(200, HEARD)]
        assert [gen for _, gen in script.seen] == [1, 2]


@pytest.mark.parametrize("answer", [(200, EMPTY), (200, HEARD)], ids=["silence", "speech"])
def test_a_live_engines_transcription_is_passed_on_once(answer: Any) -> None:
    """An empty text from an engine not told to stop is its answer (silent audio)."""
    with scripted.setup(answer, (200, HEARD)) as (g, script, _d):
        assert post(g.port, TRANSCRIPTIONS, AUDIO) == answer
        settle(g)
        assert g.stats.replayed == 0 and len(script.seen) == 1


def test_a_transcription_stream_with_text_is_never_replayed() -> None:
    with scripted.setup(("stream", [TOKEN, ABORT, DONE], "end"), (200, HEARD)) as (g, s, _d):
        status, body = post(g.port, TRANSCRIPTIONS, {**AUDIO, "stream": True})
        settle(g)
        assert status == 200 and body == TOKEN + ABORT + DONE and len(s.seen) == 1


def test_an_aborted_transcription_not_replayed_is_passed_on_as_vllm_sent_it() -> None:
    with scripted.setup(("later", (200, EMPTY))) as (g, script, _d):
        g.forwarder.replay = False
        out, t = in_thread(lambda: post(g.port, TRANSCRIPTIONS, AUDIO))
        wait_until(lambda: len(script.seen) == 1, 10 * TIMEOUT_SCALE, "the request at vLLM")
        g.stop_order(1)
        script.hung.set()
        t.join(30 * TIMEOUT_SCALE)
        assert out == [(200, EMPTY)] and len(script.seen) == 1


@pytest.mark.parametrize(("body", "stopped", "said"), [
    (EMPTY, True, True), (EMPTY_TRANSLATION, True, True), (EMPTY, False, False),
    (HEARD, True, False), (b'{"text":"","segments":[],"duration":3.0}', True, True),
    (b"not json", True, False)])
def test_what_a_whole_transcription_says(body: bytes, stopped: bool, said: bool) -> None:
    assert aborted.answer(TRANSCRIPTIONS, 200, body, stopped) is said
    assert aborted.answer(TRANSCRIPTIONS, 400, body, stopped) is False
