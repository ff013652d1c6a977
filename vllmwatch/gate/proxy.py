"""The forwarding handler: hold at the door, forward, replay what vLLM never answered.

A request is sent to one engine generation (the child's pid) at most once (unless that
engine serves on, no restart of it begun, SAME_ENGINE_GRACE after it failed). When that engine
dies, hangs or is stopped before anything of the answer reached the client, a request to a
pure-inference path (gate/replay.py) waits at the door again for the next engine, at most
gate.replay_max times and within gate.hold_timeout from its arrival; else it is answered 502
saying why. An answer begun is never replayed (a stream ends with an error event its client
parses, counted). A connection vLLM refused (nothing sent) is tried again after the door.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web

from vllmwatch.gate import exchange, head, replay
from vllmwatch.gate import guard as guardmod
from vllmwatch.gate.door import STOPPING, Door, Fence, GateStats, GenBook, GenFigures, Readiness
from vllmwatch.gate.guard import error_response as _error
from vllmwatch.gate.replay import STOPPED, upstream_target

if TYPE_CHECKING:
    from vllmwatch.gate.apikey import HeldKey

REFUSED_HOLD = 0.5  # after vLLM refused a connection, hold this long before trying again
# Idle upstream connections are dropped before vLLM's uvicorn drops them (exchange.Upstreams):
# a reused one it was closing looked like the engine's death; a healthy engine's client got 503.
KEEPALIVE = exchange.KEEPALIVE  # the ceiling of Forwarder.upstreams.keepalive
NEXT_ENGINE_POLL = 0.05  # a replay waits for an engine it was not sent to yet
# ... or this long for the failed one's restart to begin: vLLM that dropped a connection and
# serves on (vllmwatch saw no death past its engine-death and health checks) gets it again.
SAME_ENGINE_GRACE = 10.0
SPENT = "it arrived over {:g}s (gate.hold_timeout) ago"  # a 503, never logged as replayed


class Forwarder:
    """Owns the client session to vLLM and handles every request of the gate's server."""

    def __init__(self, door: Door, upstream: str, hold_timeout: float, retry_after: float,
                 stats: GateStats, generation: Callable[[], int | None] | None = None,
                 log: Callable[..., None] | None = None) -> None:
        self.door, self.upstream, self.stats = door, upstream.rstrip("/"), stats
        self.hold_timeout, self.retry_after = hold_timeout, retry_after
        self.replay, self.replay_max = True, 1  # [gate] replay, replay_max (SIGHUP sets them)
        self.replay_body = guardmod.MAX_BODY  # the body cap (read now); none over it is replayed
        self.fence, self.suspects = Fence(), replay.Suspects()  # (requests at engine deaths)
        self._generation = generation or (lambda: -door.epoch)  # no daemon: the door's epoch
        self._log = log or (lambda *a, **k: None)
        self.live: set[exchange.Exchange] = set()  # exchanges under way, for cut()
        self.gens = GenBook()  # the figures of the newest generations
        self.upstreams = exchange.Upstreams()  # the sessions to vLLM and to the spare
        self.upstreams.keepalive = min(KEEPALIVE, self.upstreams.keepalive)
        self.guard: guardmod.Guard | None = None  # set by the runner once its server exists
        # The sleeping spare engine (issue 34): its Unix socket, whether it serves now (the
        # daemon's snapshot says so only once it is proven awake), and what it has in flight
        self.spare_socket: str | None = None
        self.to_spare: Callable[[], bool] = lambda: False
        # (generation, to the spare) in one look; the daemon's runner reads one snapshot
        self.route: Callable[[], tuple[int | None, bool]] = lambda: (
            self._generation(), self.to_spare())
        self.spare_in_flight = 0
        self.key: HeldKey | None = None  # the key of the engine launched last (new_engine)

    async def open(self) -> None:
        """Create the client sessions (on the gate's loop)."""
        self.upstreams.spare_socket = self.spare_socket
        self.upstreams.open()

    async def close(self) -> None:
        """Close the client sessions."""
        await self.upstreams.close()

    def cut(self, gen: int) -> int:
        """vllmwatch declared engine `gen` stuck: end its exchanges now (those not begun are
        replayed, begun streams end with an error event). How many were cut."""
        cut = 0
        for ex in list(self.live):
            if ex.gen == gen and ex.task is not None and not ex.task.done():
                ex.cut, cut = True, cut + 1
                ex.task.cancel()
        return cut

    def new_engine(self, gen: int, api_key: str | None = None, audio: int | None = None
                   ) -> None:
        """vllmwatch launched engine `gen` (its pid), not READY yet: a pid the kernel reused is
        a new engine, not fenced (the door would hold for good) nor given the old figures.
        `api_key`: the key it enforces (a rotated key file relaunches), `audio` its largest body
        with audio (ChildCommand.audio_body, at most half of MAX_HELD): the gate's from now."""
        self.fence.forget(gen)
        if api_key is not None or self.key is not None:  # (gate/apikey.py: only with a key)
            from vllmwatch.gate.apikey import HeldKey
            self.key = (self.key or HeldKey(self.fence)).launched(gen, api_key)
        if audio is not None:  # (ints: atomic beside the gate's loop; a guard made later takes it)
            self.replay_body = cap = min(max(guardmod.MAX_BODY, audio), guardmod.MAX_HELD // 2)
            if (guard := self.guard) is not None:
                guard.max_body = cap
        self.gens.pop(gen, None)  # (one dict operation: atomic beside the gate's thread)

    def settled(self, gen: int | None) -> GenFigures:
        """A copy of `gen`'s figures, with the exchanges still open counted now."""
        return self.gens.settled(gen, sum(1 for ex in self.live if ex.gen == gen))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Answer what its head refuses (gate/head.py), before any 100 Continue; read the
        body within the guard's bounds; hold; forward."""
        guard = self.guard
        if guard is not None:  # its head is complete: the header deadline is over, refused
            guard.begin(request.protocol)  # or not (a refused one left it running: cut at
        try:  # HEADER_TIMEOUT while the client idled, counted as a slow head)
            if (refused := await head.admit(request, self)) is not None:
                return refused
            if guard is None:
                return await self._handle(request, await request.read())
            got = await guard.read_body(request)
            if isinstance(got, web.Response):
                return got
            try:
                return await self._handle(request, got)
            finally:
                guard.release(len(got))
        finally:
            if guard is not None:
                guard.end(request)

    async def _handle(self, request: web.Request, body: bytes) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.hold_timeout  # replays too: counted from arrival
        # Hashed only while a request is suspect, else at a death (16 MiB: ~30 ms of SHA-256)
        fp = b"" if self.suspects.idle() else self.suspects.fingerprint(
            request.method, request.path, body)
        if (jailed := self.suspects.refusal(fp, loop.time())) is not None:
            self.stats.quarantine_refused += 1
            return _error(request.path, 422, jailed, kind="UnprocessableEntityError")
        held = False  # counted once per request, however often it waits
        tried: dict[int | None, float] = {}  # engines it failed on, and when
        failures, tries, pause = 0, 0, 0.0
        while True:
            tries += 1
            self.door.refresh()
            if not held and (self.door.state != Readiness.OPEN or self.door.waiting):
                held, self.stats.held = True, self.stats.held + 1
            if verdict := await self._wait_at_door(request, deadline - loop.time(), tries > 1,
                                                   failures > 0, pause):
                return verdict
            probation = self.suspects.on_probation(fp, loop.time())
            broke: list[bool] = []
            try:
                async with self.suspects.turn(probation, deadline - loop.time(), lambda: (
                        self.door.state == Readiness.CLOSED)) as turn:
                    sent = await self._send(request, body, tried, failures > 0, broke)
                    turn.freeze()  # (read before the next request's turn)
            except replay.TurnClosed:
                self.stats.refused_closed += 1
                return _error(request.path, 503, STOPPING, self.retry_after)
            except replay.TurnMissed:
                self.stats.hold_timeouts += 1
                return _error(request.path, 503, replay.turn_missed(self.hold_timeout),
                              self.retry_after)
            except exchange.NOT_SENT:
                # Refused (or not connected in time) before anything was sent: vLLM is not up
                # (yet), or its listen queue is full; safe to try again.
                self.stats.connect_retries += 1
                self.door.suspect(REFUSED_HOLD)
                continue
            if sent is None:  # an engine it was sent to already, or told to stop: the next
                pause = NEXT_ENGINE_POLL  # one, until its hold is spent (above)
                continue
            gen, answer = sent
            # A death counts against the request (begun or not); a stop vllmwatch ordered does
            # not, whatever vLLM answers to it (EngineDeadError too: replay.STOPPED), a hang does
            died = (broke or isinstance(answer, exchange.Failed)) and answer not in STOPPED \
                and (answer == "engine_stuck" or not self.fence.stopped(gen))
            if died:
                fp = fp or self.suspects.fingerprint(request.method, request.path, body)
                self._died(request, body, fp, gen, turn)
            if not isinstance(answer, exchange.Failed):
                if not died:
                    self.suspects.answered(fp, gen)
                return answer  # (a replay's answer is counted in _forward)
            tried[gen], failures, pause = loop.time(), failures + 1, 0.0
            why_not = self._why_not(request, body, failures, fp, deadline - loop.time())
            fig = self.gens.of(gen)
            if why_not is not None:
                fig.not_replayed += 1
                if answer.answer is not None:  # vLLM's own (aborted) answer, as it came
                    return answer.answer
                late = why_not == SPENT.format(self.hold_timeout)  # as a held request's
                return guardmod.not_sent(request.path, 503 if late else 502, str(answer),
                                         why_not, self.retry_after)
            self.stats.replayed, fig.replayed = self.stats.replayed + 1, fig.replayed + 1
            self._log("warning", "gate.replayed", path=request.path, size=len(body),
                      engine_pid=gen, failure=str(answer), replay=failures,
                      detail="vLLM failed before any of the answer reached the client; "
                             "the request waits for the next engine and is sent once more")

    async def _send(self, request: web.Request, body: bytes, tried: dict[int | None, float],
                    replayed: bool, broke: list[bool]
                    ) -> tuple[int | None, web.StreamResponse | exchange.Failed] | None:
        """One try: (engine, its answer or why it failed unanswered); None when not sent (an
        engine it was sent to already, or told to stop). `broke`: True once begun, then failed."""
        loop = asyncio.get_running_loop()
        gen, spare = self._route()
        # Never to an engine it was sent to already (failure not published yet) or told to stop
        if gen in tried and loop.time() - tried[gen] >= SAME_ENGINE_GRACE:
            del tried[gen]  # no restart of it began: it lives, and gets it once more
        if gen in tried or not self.fence.begin(gen):
            self.spare_in_flight -= spare
            return None
        return gen, await self._forward(request, body, gen, spare, replayed, broke)

    def _died(self, request: web.Request, body: bytes, fp: bytes, gen: int | None,
              turn: replay.Turn) -> None:
        """The engine died with this request in flight: counted against it (replay.py)."""
        deaths = self.suspects.died(fp, asyncio.get_running_loop().time(), turn, gen)
        if deaths is not None:
            self.stats.quarantined += 1
            self._log("error", "gate.quarantined", **replay.quarantined_fields(
                fp, request.path, len(body), gen, deaths))

    def count(self, reason: str) -> None:
        """A refusal of the gate's own: counted by the guard (and logged by the runner)."""
        if self.guard is not None:
            self.guard.count(reason)
        else:
            setattr(self.stats, reason, getattr(self.stats, reason) + 1)

    def _why_not(self, request: web.Request, body: bytes, failures: int, fp: bytes,
                 left: float) -> str | None:
        """None when it may be replayed once more; else why not (counted). `left`: of its hold."""
        if self.suspects.refusal(fp, asyncio.get_running_loop().time()) is not None:
            why: str | None = "it is quarantined (gate.quarantined)"
        elif not self.replay:
            why = "gate.replay is off"
        elif len(body) > self.replay_body:
            why = f"its {len(body)}-byte body is over the {self.replay_body} bytes the gate replays"
        else:  # its path, or what it carries
            why = replay.not_replayable(request.method, request.path, body)
        if why is not None:
            self.stats.not_replayed += 1
            return why
        self.stats.replay_gave_up += failures > self.replay_max or left <= 0
        if failures > self.replay_max:
            return f"it was replayed {self.replay_max} time(s) already (gate.replay_max)"
        return SPENT.format(self.hold_timeout) if left <= 0 else None

    async def _wait_at_door(self, request: web.Request, timeout: float, again: bool,
                            replay: bool, pause: float) -> web.Response | None:
        """None: send it now, after `pause`; else its answer (`again`: a retry, ended by its spent
        hold; `replay` not sent: given up). Key: held, at once; else once the door opens."""
        path, wait = request.path, timeout - pause
        self.stats.holding += 1
        try:
            if pause:  # (none: no turn of the loop more for every request)
                await asyncio.sleep(pause)
            passed = None if again and wait <= 0 else await (self.door.enter(max(0.0, wait)) if (
                self.key is None) else self.key.enter(self.door, max(0.0, wait), request))
        except asyncio.CancelledError:  # its client left (aiohttp cancels the handler): its
            self.stats.replay_gave_up += replay  # doing, but a replay counted was never sent
            self.count("clients_left")
            raise
        finally:
            self.stats.holding -= 1
        self.stats.replay_gave_up += replay and passed is not True  # answered by the gate
        if passed is None:
            self.stats.hold_timeouts += 1
            return _error(path, 503, f"vLLM is not ready after {self.hold_timeout:g}s "
                          "(gate.hold_timeout); it is starting or restarting", self.retry_after)
        if not passed:
            self.stats.refused_closed += 1
            return _error(path, 503, STOPPING, self.retry_after)
        if passed != "unauthorized":
            return None
        self.count("unauthorized")  # (counted, logged at a bounded rate: gate.refused)
        return web.json_response({"error": "Unauthorized"}, status=401)  # vLLM's own 401

    def _route(self) -> tuple[int | None, bool]:
        """(the engine generation, whether it is the spare) from one look at the daemon's snapshot
        (read apart, a route that moved between them counted a request under the other's
        generation). Counted in the spare's in-flight before the look (issue 34): a drain of the
        spare that sees none knows none will reach it; the caller takes off one not sent there."""
        self.spare_in_flight += 1
        gen, spare = self.route()
        spare = spare and self.upstreams.spare is not None
        self.spare_in_flight -= not spare
        return gen, spare

    async def _forward(self, request: web.Request, body: bytes, gen: int | None,
                       spare: bool, replay: bool = False, broke: list[bool] | None = None
                       ) -> web.StreamResponse | exchange.Failed:
        """One exchange with engine `gen` (the fence counted its send in _handle), the spare
        when `spare` (counted in its in-flight by _route); replay: sent to another before."""
        main, spare_session = self.upstreams.main, self.upstreams.spare
        assert main is not None
        ex = exchange.Exchange(gen, self.fence, request.path, bool(body))
        session = spare_session if spare and spare_session else main
        # The path checked (gate/replay.py), never the client's raw form of it.
        url = ("http://spare" if spare else self.upstream) + upstream_target(
            request.path, request.rel_url.raw_query_string)
        self.stats.forwarded += 1
        self.stats.in_flight += 1
        self.live.add(ex)
        answered = [False]  # an answer came back (counted here: a cut may cancel the caller)
        try:
            ex.task = asyncio.ensure_future(exchange.run(session, request, url, body, ex))
            answer: web.StreamResponse | exchange.Failed
            try:
                answer = await ex.task
            except asyncio.CancelledError:
                if not ex.cut or ex.begun:  # the client left, or the gate stops
                    raise  # (else cut before its first step: nothing was sent, replayed)
                answer = exchange.Failed("engine_stuck")
            if isinstance(answer, exchange.Failed):
                self.stats.failed_midrequest += 1
                self.gens.of(gen).failed += 1
            else:
                answered[0] = True
            return answer
        except exchange.NOT_SENT:
            self.stats.forwarded -= 1  # nothing was sent; the caller tries again
            raise
        except asyncio.TimeoutError:
            self.stats.failed_midrequest += 1
            self.stats.upstream_timeouts += 1
            fig = self.gens.of(gen)
            fig.failed, fig.not_replayed = fig.failed + 1, fig.not_replayed + 1
            return _error(request.path, 504, "vLLM's answer was not complete within its deadline; "
                          "not retried: send it again if it is safe to repeat", self.retry_after)
        finally:
            if replay and (ex.begun or answered[0]):
                self.stats.replay_answered += 1  # the next engine answered (maybe cut later)
            if ex.broken or ex.vllm_error:  # begun, then vLLM failed: ended, not replayed
                # (here: closing the client's connection may cancel this handler)
                self.stats.failed_midrequest += 1
                self.stats.cut_midstream += 1
                self.gens.of(gen).cut += 1
                if broke is not None:
                    broke.append(True)
            elif answered[0] and self.fence.stopped(gen):
                self.gens.of(gen).answered += 1
            ex.mark_written()  # once: a task cut before its first step never told the fence
            self.stats.in_flight -= 1
            self.spare_in_flight -= spare
            self.live.discard(ex)
            self.stats.forwarded_after_stop = self.fence.late
