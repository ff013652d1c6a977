"""A request that takes vLLM's engine down is not sent again and again (gate/replay.py
Suspects): in flight at two engine deaths, a request is sent alone; one that dies alone is
quarantined (422, which no client retries) while the innocents in flight beside it at every
death are answered. Before it, the gate replayed the culprit into each new engine with
every innocent, and a client retrying its 502 (the openai package does, twice) crash-looped
vLLM until vllmwatch gave up.

The upstream plays vLLM by the prompt: POISON kills the engine (every request in flight on it
is reset, as when the API server dies) once the others expected beside it are in flight;
any other prompt is answered once the test releases it, or reset with the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.shell.test_gate_replay import Daemonish, in_thread, post, settle
from tests.shell.test_gate_review6 import _ask
from tests.support import TIMEOUT_SCALE, free_port, wait_until
from vllmwatch.gate import replay
from vllmwatch.gate.runner import Gate

OK = json.dumps({"id": "cmpl-1", "object": "text_completion",
                 "choices": [{"index": 0, "text": "fine"}]}).encode()
POISON = "POISON"
WAIT = 30 * TIMEOUT_SCALE


class Engine:
    """vLLM's engines, one generation after another; the daemon relaunches at each death."""

    def __init__(self, daemon: Daemonish) -> None:
        self.daemon = daemon
        self.cond = threading.Condition()
        self.seen: list[tuple[str, int]] = []  # (prompt, generation)
        self.deaths: list[int] = []  # generations that died
        self.beside = 0  # a poison waits for this many others in flight on its generation
        self.release = threading.Event()  # innocents answer once set
        self.done: dict[int, int] = {}  # innocents answered or reset, by generation

    def in_flight(self, gen: int) -> int:
        """Innocents on engine `gen` now."""
        return sum(1 for p, g in self.seen if g == gen and p != POISON) - self.done.get(gen, 0)

    def let_go(self) -> None:
        """Innocents are answered from now on (those waiting too)."""
        with self.cond:
            self.release.set()
            self.cond.notify_all()

    def kill(self) -> None:
        """The serving engine dies (a crash of its own); vllmwatch relaunches it."""
        with self.cond:
            self.deaths.append(self.daemon.gen)
            self.daemon.gen += 1
            self.cond.notify_all()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def do_POST(self) -> None:
        engine: Engine = self.server.engine
        prompt = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["prompt"]
        with engine.cond:
            gen = engine.daemon.gen
            engine.seen.append((prompt, gen))
            engine.cond.notify_all()
            if prompt == POISON:
                engine.cond.wait_for(lambda: engine.in_flight(gen) >= engine.beside, WAIT)
                engine.kill()  # (the condition's lock is reentrant)
            else:
                engine.cond.wait_for(lambda: engine.release.is_set()
                                     or gen in engine.deaths, WAIT)
                engine.done[gen] = engine.done.get(gen, 0) + 1
        if prompt == POISON or gen in engine.deaths:
            self.connection.shutdown(2)  # the engine's API server died with it
            self.close_connection = True
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(OK)))
        self.end_headers()
        self.wfile.write(OK)

    def log_message(self, *args: Any) -> None:
        """Quiet."""


@contextmanager
def upstream(hold: float = 60.0) -> Iterator[tuple[Gate, Engine]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    d = Daemonish()
    engine = server.engine = Engine(d)  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    events: list[tuple[str, dict[str, Any]]] = []
    g = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{server.server_address[1]}",
             d.readiness, hold, retry_after=3, generation=d.generation,
             log=lambda level, event, **kw: events.append((event, kw)))
    g.events = events  # type: ignore[attr-defined]
    g.start()
    try:
        yield g, engine
    finally:
        engine.let_go()
        g.stop()
        server.shutdown()
        server.server_close()


def _body(prompt: str) -> dict[str, Any]:
    return {"model": "m", "prompt": prompt, "max_tokens": 3}


def _send_all(g: Gate, engine: Engine, innocents: list[str]) -> list[tuple[list[Any],
                                                                            threading.Thread]]:
    """The innocents in flight first, then the poison beside them."""
    runs = [in_thread(lambda p=p: post(g.port, body=_body(p))) for p in innocents]
    with engine.cond:
        engine.cond.wait_for(lambda: engine.in_flight(engine.daemon.gen) >= len(innocents),
                             WAIT)
    runs.append(in_thread(lambda: post(g.port, body=_body(POISON))))
    return runs


def _answers(runs: list[tuple[list[Any], threading.Thread]]) -> list[tuple[int, bytes]]:
    for _out, t in runs:
        t.join(WAIT)
    return [out[0] for out, _t in runs]


@pytest.mark.parametrize("innocents", [1, 3])
def test_a_request_that_kills_every_engine_is_quarantined_and_the_innocents_are_answered(
        innocents: int) -> None:
    names = [f"innocent {i}" for i in range(innocents)]
    with upstream() as (g, engine):
        engine.beside = innocents
        # Engine 1 dies with everything in flight; the gate replays all of it into engine 2,
        # which dies the same way: every request is 502 (replay_max 1), each with 2 deaths.
        first = _answers(_send_all(g, engine, names))
        settle(g)
        assert [s for s, _ in first] == [502] * (innocents + 1), first
        assert engine.deaths == [1, 2]
        assert g.stats.quarantined == 0
        # Their clients send them again (the openai package retries a 502): each is sent
        # alone now; the poison kills engine 3 alone and is quarantined, the rest answered.
        engine.beside = 0
        engine.let_go()
        again = [in_thread(lambda p=p: post(g.port, body=_body(p))) for p in names]
        again.append(in_thread(lambda: _ask(g.port, body=_body(POISON))))
        retried = _answers(again)
        settle(g)
        assert retried[:innocents] == [(200, OK)] * innocents, retried
        status, headers, body = retried[-1]  # type: ignore[misc]
        assert status == 502 and b"quarantined" in body, retried[-1]
        # its 502 names no time to send it again (it would be refused 422), and tells the
        # openai package's retry not to
        assert "Retry-After" not in headers and headers.get("X-Should-Retry") == "false"
        assert engine.deaths == [1, 2, 3], "one more death, the poison's alone"
        assert g.stats.quarantined == 1
        (event,) = [kw for e, kw in g.events if e == "gate.quarantined"]  # type: ignore[attr-defined]
        assert event["deaths"] == 3 and event["path"] == "/v1/completions"
        assert POISON not in repr(g.events) and "sk-secret" not in repr(g.events)  # type: ignore[attr-defined]
        # Sent again: refused at once, never reaching vLLM, as 422 (no client retries it).
        seen = len(engine.seen)
        status, body = post(g.port, body=_body(POISON))
        assert status == 422 and event["fingerprint"].encode() in body
        assert len(engine.seen) == seen and g.stats.quarantine_refused == 1
        assert post(g.port, body=_body(names[0])) == (200, OK)  # an innocent is not
        assert engine.deaths == [1, 2, 3]


def test_one_death_replays_everything_together_and_an_answer_clears_it() -> None:
    """A single crash (the common case): every request goes on together at once, none sent
    alone; answered, none of them is a suspect any more."""
    with upstream() as (g, engine):
        runs = [in_thread(lambda p=p: post(g.port, body=_body(p))) for p in ("a", "b")]
        wait_until(lambda: engine.in_flight(1) == 2, WAIT, "both in flight on engine 1")
        engine.kill()
        wait_until(lambda: engine.in_flight(2) == 2, WAIT, "both on engine 2 at once")
        assert len(g.forwarder.suspects._deaths) == 2  # one death each: not on probation
        engine.let_go()
        assert _answers(runs) == [(200, OK)] * 2
        settle(g)
        assert not g.forwarder.suspects._deaths and g.stats.quarantined == 0


# ---- the pure bookkeeping ----

FP = replay.Suspects.fingerprint("POST", "/v1/completions", b"x")


def _turn(s: replay.Suspects, fp: bytes, now: float, alone: bool) -> replay.Turn:
    """A finished send at `now`; alone: on probation with nobody beside it."""
    turn = replay.Turn(s, alone and s.on_probation(fp, now))
    turn.sent_at = now
    turn.freeze()
    return turn


def test_probation_quarantine_expiry_and_an_answer() -> None:
    s = replay.Suspects()

    def died(t: float, gen: int, alone: bool = False) -> int | None:
        return s.died(FP, t, _turn(s, FP, t - 0.5, alone), gen)

    assert not s.on_probation(FP, 0.0) and s.refusal(FP, 0.0) is None
    assert died(1.0, 1) is None and not s.on_probation(FP, 1.0)
    assert died(1.5, 1) is None and not s.on_probation(FP, 1.5), \
        "two identical requests at one engine's death are one death"
    assert died(2.0, 2) is None and s.on_probation(FP, 2.0)
    assert not s.on_probation(FP, 2.0 + replay.SUSPECT_FOR)  # deaths long ago: forgotten
    s.answered(FP)
    assert not s.on_probation(FP, 3.0)
    died(4.0, 3)
    died(5.0, 4)
    late = _turn(s, FP, 5.5, alone=True)  # sent after engine 4 was seen dead: not its death
    assert s.died(FP, 5.6, late, 4) is None and s.refusal(FP, 5.6) is None
    assert died(6.0, 5, alone=True) == 3
    refusal = s.refusal(FP, 7.0)
    assert refusal is not None and FP.hex()[:12] in refusal
    assert s.refusal(FP, 6.0 + replay.SUSPECT_FOR) is None  # the quarantine ends


def test_an_engine_that_answers_after_a_dropped_connection_is_not_seen_dead() -> None:
    """A connection dropped on an engine that serves on had the engine seen dead for good:
    a request that really killed it later went uncounted (sent after its "death")."""
    s = replay.Suspects()
    other = replay.Suspects.fingerprint("POST", "/p", b"other")
    assert s.died(other, 1.0, _turn(s, other, 0.5, False), 7) is None  # a dropped connection
    s.answered(replay.Suspects.fingerprint("POST", "/p", b"x"), 7)  # engine 7 answers on
    assert s.died(FP, 3.0, _turn(s, FP, 2.0, False), 7) is None
    assert s._deaths[FP][0] == 1  # counted: engine 7 lived until then


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["died", "alone", "answered"]),
                          st.floats(0.0, 2 * replay.SUSPECT_FOR), st.integers(1, 4)),
                max_size=40))
def test_only_a_request_that_died_alone_on_probation_is_ever_refused(
        steps: list[tuple[int, str, float, int]]) -> None:
    """Whatever happens, a request is refused only after it died while sent alone, which
    it is only after PROBATION_AT deaths within SUSPECT_FOR; and no refusal outlasts it."""
    s = replay.Suspects()
    fps = [replay.Suspects.fingerprint("POST", "/v1/completions", b"%d" % i) for i in range(4)]
    now = 0.0
    jailed_at: dict[int, float] = {}
    for who, what, dt, gen in steps:
        now += dt
        fp = fps[who]
        if what == "answered":
            s.answered(fp)
            continue
        turn = _turn(s, fp, now, what == "alone")
        if s.died(fp, now, turn, gen) is not None:
            assert turn.alone
            jailed_at[who] = now
        for i, f in enumerate(fps):
            refused = s.refusal(f, now) is not None
            assert refused == (i in jailed_at and now - jailed_at[i] < replay.SUSPECT_FOR)


def test_the_tables_are_bounded() -> None:
    s = replay.Suspects()
    for i in range(replay.SUSPECTS_KEPT + 10):
        fp = replay.Suspects.fingerprint("POST", "/p", b"%d" % i)
        s.died(fp, 1.0, _turn(s, fp, 0.5, False), gen=1)
    assert len(s._deaths) == replay.SUSPECTS_KEPT


def test_a_request_that_leaves_while_waiting_its_turn_frees_it() -> None:
    """Its client left (the handler cancelled) while it waited for the others to end: the
    one place is free again, else every later request on probation waited out its hold."""
    async def go() -> None:
        s = replay.Suspects()
        s.sending = 1  # another request in flight: the one on probation waits for it
        waiting = asyncio.ensure_future(s.turn(True, 30.0).__aenter__())

        async def took_the_place() -> None:  # then it waits for the others to end
            while s._alone is None and not waiting.done():
                await asyncio.sleep(0.01)

        await asyncio.wait_for(took_the_place(), WAIT)
        assert s._alone is not None and not waiting.done()
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        assert s._alone is None
        s.sending = 0
        async with s.turn(True, 5.0) as turn:
            assert turn.alone
    asyncio.run(go())


def test_a_request_waiting_its_turn_when_the_gate_stops_is_answered_stopping() -> None:
    """A request on probation waits for the others in flight to end; the gate stopped
    meanwhile: its wait never looked at the door, and the server's shutdown dropped its
    connection without an answer (every other held request gets 503 "stopping")."""
    with upstream() as (g, engine):
        fp = replay.Suspects.fingerprint("POST", "/v1/completions",
                                         json.dumps(_body(POISON)).encode())
        g.forwarder.suspects._deaths[fp] = (replay.PROBATION_AT, time.monotonic(), 0)
        innocent = in_thread(lambda: post(g.port, body=_body("innocent")))
        with engine.cond:
            engine.cond.wait_for(lambda: engine.in_flight(1) == 1, WAIT)
        out, t = in_thread(lambda: post(g.port, body=_body(POISON)))
        wait_until(lambda: g.forwarder.suspects._alone is not None, WAIT,
                   "the request on probation to wait for its turn")
        g.stop()
        t.join(WAIT)
        assert out[0][0] == 503 and b"vllmwatch is stopping" in out[0][1], out
        engine.let_go()
        innocent[1].join(WAIT)


def test_a_replay_whose_hold_is_spent_is_not_sent_through_an_open_door() -> None:
    """The engine died after the request's gate.hold_timeout had passed: the door was open
    (the next engine serves), so the replay went out at once, past its hold, where every
    other wait of it ends in 503 at the hold."""
    hold = 1.0
    with upstream(hold) as (g, engine):
        start = time.monotonic()
        out, t = in_thread(lambda: post(g.port, body=_body("slow")))
        with engine.cond:
            engine.cond.wait_for(lambda: engine.in_flight(1) == 1, WAIT)
        wait_until(lambda: time.monotonic() > start + hold + 0.5, WAIT, "the hold to pass")
        engine.kill()  # the next engine serves at once: the door stays open
        t.join(WAIT)
        assert out[0][0] == 503 and b"gate.hold_timeout" in out[0][1], out
        assert [p for p, _g in engine.seen] == ["slow"]  # never sent to engine 2
        assert g.stats.replay_gave_up == 1
