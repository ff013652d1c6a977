"""The gate's thread: its own asyncio event loop, so client traffic never blocks the watchdog.
The daemon starts it over its snapshots (`start_gate`), reads its counters (`with_gate`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import os
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from vllmwatch.config.hosts import connect_host, parse_address, url_host
from vllmwatch.config.schema import Config
from vllmwatch.gate import guard as guardmod
from vllmwatch.gate.door import Door, GateStats, Readiness, readiness_of
from vllmwatch.gate.exchange import keepalive_of
from vllmwatch.gate.guard import MAX_CONNECTIONS
from vllmwatch.gate.proxy import Forwarder
from vllmwatch.logfn import LogFn
from vllmwatch.status.http_guard import Rejections
from vllmwatch.status.snapshot import Snapshot
from vllmwatch.status.statusline import systemctl

START_TIMEOUT = 10.0
# An incident record waits this long for the failed engine's requests to be settled (replayed,
# cut or answered): at once after a cut; vLLM fails them within ~0.1 s when its engine dies.
FIGURES_SETTLE, FIGURES_POLL = 1.0, 0.02
SHUTDOWN_GRACE = 3.0
GUARD_REASONS = ("shed_connections", "idle_timeouts", "header_timeouts", "body_timeouts",
                 "too_large", "held_full", "path_refused", "bad_encoding", "unauthorized")
_REFUSED = ("gate clients were cut or refused (shed_connections: over the connection cap; "
            "idle/header/body_timeouts: too slow; too_large: body over the cap; held_full: "
            "too many bodies held at once; path_refused: not a client API, 404: gate/replay.py; "
            "bad_encoding: not plain or chunked; unauthorized: no or a wrong API key, 401); vLLM "
            "and the watchdog are not affected. Look for clients that connect and stay idle, "
            "send slowly, call admin endpoints through the gate, or lack vLLM's API key.")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (~1 point more of direct throughput at high
    request rates: docs/BENCHMARKS.md section 7) on Python >= 3.11 (asyncio.Runner takes a loop
    factory); asyncio's own otherwise, or with VLLMWATCH_GATE_UVLOOP=0."""
    if os.environ.get("VLLMWATCH_GATE_UVLOOP", "1") == "0" or sys.version_info < (3, 11):
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def loop_name() -> str:
    """"uvloop" or "asyncio": what the gate runs on here (shown in /status)."""
    return "asyncio" if loop_factory() is None else "uvloop"


def _run_on_loop(main: Callable[[], Coroutine[Any, Any, None]],
                 factory: Callable[[], asyncio.AbstractEventLoop] | None) -> None:
    """asyncio.run(main()) on `factory`'s loop: same cancellation of leftover tasks at the end."""
    if factory is None or sys.version_info < (3, 11):  # the version test narrows for mypy
        asyncio.run(main())
        return
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


class GateError(Exception):
    """The gate could not start (e.g. gate.listen is taken); the message says what to fix."""


class Gate:
    """The front door: start() binds gate.listen and serves in a thread; stop() ends it."""

    def __init__(self, listen: str, upstream: str, get_readiness: Callable[[], Readiness],
                 hold_timeout: float, retry_after: float,
                 on_error: Callable[[str], None] | None = None, log: LogFn | None = None,
                 max_connections: int = guardmod.MAX_CONNECTIONS,
                 generation: Callable[[], int | None] | None = None) -> None:
        self.host, self.port = parse_address(listen)
        self.listen = listen
        self.stats, self.max_connections = GateStats(), max_connections
        self.guard: guardmod.Guard | None = None
        self.refusals = Rejections(log or (lambda *a, **k: None), event="gate.refused",
                                   detail=_REFUSED, reasons=GUARD_REASONS)
        self._log = log or (lambda *a, **k: None)
        self._generation = generation
        self.door = Door(self._readiness(get_readiness))
        self.forwarder = Forwarder(self.door, upstream, hold_timeout, retry_after, self.stats,
                                   generation, self._log)
        self.error: str | None = None
        self._factory = loop_factory()  # chosen once: what /status says is what runs
        self.loop = "asyncio" if self._factory is None else "uvloop"
        self._on_error = on_error
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllmwatch-gate", daemon=True)

    def start(self) -> None:
        """Bind and serve; raise GateError if it cannot."""
        self._thread.start()
        if not self._started.wait(START_TIMEOUT):  # not `running`: the start ends on it
            self._fail(f"gate.listen {self.listen}: not serving after {START_TIMEOUT:g}s")
        if self.error is not None:
            raise GateError(self.error)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (in-flight requests are cut) and join the thread, bounded."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                loop.call_soon_threadsafe(stop.set)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _readiness(self, get: Callable[[], Readiness]) -> Callable[[], Readiness]:
        """The daemon's readiness, held while its engine generation was told to stop."""
        def readiness() -> Readiness:
            state = get()
            gen = self._generation() if self._generation is not None else None
            if state == Readiness.OPEN and self.forwarder.fence.stopped(gen):
                return Readiness.HOLD
            return state
        return readiness

    def stop_order(self, gen: int | None, cut: bool = False) -> None:
        """The daemon is about to signal engine generation `gen` (its pid): from now on
        nothing is sent to it, and this returns once what was under way is in its socket
        (bounded: gate/door.py, Fence). cut: the engine is stuck, so its exchanges are ended at
        once (those not begun are replayed). Called on the loop's thread."""
        loop = self._loop
        if gen is None or loop is None or not self.running:
            return
        first = not self.forwarder.fence.stopped(gen)  # a hang: at the verdict, then the kill
        with contextlib.suppress(RuntimeError):  # the loop closed in between
            loop.call_soon_threadsafe(self._stopped, gen, cut, first)
        if first and not self.forwarder.fence.order(gen):  # the first order waits
            self._log("warning", "gate.fence_timeout", engine_pid=gen,
                      detail="requests being sent to vLLM were still not written when it was "
                             "told to stop; they may fail and are counted in forwarded_after_stop")

    def _stopped(self, gen: int, cut: bool, first: bool) -> None:
        """On the gate's loop: count the order, hold the door, cut a stuck engine's."""
        self.stats.stop_orders += 1 if first else 0
        self.door.refresh()
        if cut and (n := self.forwarder.cut(gen)):
            self._log("warning", "gate.cut", engine_pid=gen, requests=n,
                      detail="vLLM's engine is stuck: its requests in flight were ended now; "
                             "those with no answer begun wait for the next engine")

    def figures(self, gen: int | None, settle: float = FIGURES_SETTLE) -> dict[str, int] | None:
        """What became of the requests in flight to engine generation `gen` (its pid), for
        the incident record: a copy made on the gate's loop once none of them is open any
        more, or after `settle` seconds (any thread; None when the gate does not serve)."""
        loop = self._loop
        if loop is None or not self.running:
            return None

        async def settled() -> dict[str, int]:
            end = loop.time() + settle
            fig = self.forwarder.settled(gen)
            while fig.open and loop.time() < end:
                await asyncio.sleep(FIGURES_POLL)
                fig = self.forwarder.settled(gen)
            return {**dataclasses.asdict(fig), "in_flight": fig.in_flight}

        try:
            return asyncio.run_coroutine_threadsafe(settled(), loop).result(settle + 2.0)
        except (RuntimeError, concurrent.futures.TimeoutError,
                concurrent.futures.CancelledError):  # the gate stopped in between
            return None

    def reconfigure(self, hold_timeout: float, retry_after: float, replay: bool,
                    replay_max: int, keepalive: float | None = None, upstream: str = "") -> None:
        """A reload's gate.hold_timeout, retry_after, replay, replay_max, vLLM's keep-alive and
        address (any thread): written on the gate's thread, where requests read them (32.5)."""
        def apply() -> None:
            fwd = self.forwarder
            fwd.hold_timeout, fwd.retry_after = hold_timeout, retry_after
            fwd.replay, fwd.replay_max = replay, replay_max
            fwd.upstream = upstream.rstrip("/") or fwd.upstream  # vllm.host/port reloaded
            if keepalive is not None:
                fwd.upstreams.narrow(keepalive)

        loop = self._loop
        if loop is None or loop.is_closed():
            apply()  # not serving (yet, or any more): no request reads them
            return
        try:
            loop.call_soon_threadsafe(apply)
        except RuntimeError:  # the loop closed in between
            apply()

    @property
    def running(self) -> bool:
        """Whether the gate thread is alive and has not failed."""
        return self._thread.is_alive() and self.error is None

    def snapshot(self) -> dict[str, Any]:
        """Counters and health for /status and the metrics (any thread)."""
        guard = self.guard
        if guard is not None:  # gauges, read racily from another thread: fine for a figure
            self.stats.connections, self.stats.held_bytes = len(guard.conns), guard.held
        out: dict[str, Any] = dataclasses.asdict(self.stats)
        out.update(listen=self.listen, running=self.running, error=self.error, loop=self.loop)
        return out

    def _run(self) -> None:
        try:
            _run_on_loop(self._main, self._factory)
        except BaseException as exc:  # any failure must reach the daemon
            self._fail(f"{type(exc).__name__}: {exc}")
        finally:
            self._started.set()

    def _fail(self, error: str) -> None:
        if self.error is None:
            self.error = error
            if self._on_error is not None and self._started.is_set():
                self._on_error(error)

    async def _main(self) -> None:
        self._stop, self._loop = asyncio.Event(), (loop := asyncio.get_running_loop())
        # No route: every request is _front's (set below; CONNECT, OPTIONS * too)
        app = web.Application(client_max_size=guardmod.MAX_BODY)
        # On stop, in-flight and held requests get SHUTDOWN_GRACE s, then are cut. Idle
        # keep-alive connections close at the guard's idle deadline (counted there).
        # auto_decompress off: vLLM gets the client's body byte for byte (not decoded gzip)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                               shutdown_timeout=SHUTDOWN_GRACE, auto_decompress=False,
                               keepalive_timeout=guardmod.IDLE_TIMEOUT + 5.0,  # ours first
                               max_headers=guardmod.MAX_HEADERS, max_field_size=guardmod.MAX_FIELD)
        await runner.setup()
        assert runner.server is not None
        runner.server.request_handler = self._front  # (each connection's handler reads it)
        guard = self.guard = guardmod.Guard(runner.server, self._count, self.max_connections)
        self.forwarder.guard, guard.max_body = guard, self.forwarder.replay_body  # (start_gate's)
        await self.forwarder.open()
        watcher = asyncio.create_task(self.door.watch())
        sweeper = asyncio.create_task(guard.sweep())
        listener: asyncio.base_events.Server | None = None
        try:
            try:
                listener = await loop.create_server(guard.factory, self.host or None, self.port,
                                                    reuse_address=True, backlog=1024)
            except OSError as exc:
                self.error = (f"gate.listen {self.listen}: cannot listen ({exc.strerror}); "
                              "choose a free port or stop what holds it")
                return
            self._started.set()
            stopping = asyncio.create_task(self._stop.wait())
            await asyncio.wait({stopping, watcher, sweeper}, return_when=asyncio.FIRST_COMPLETED)
            for task in (watcher, sweeper):
                if task.done():
                    task.result()  # the readiness watcher or the sweeper died: raise it
                    raise RuntimeError("a gate task ended")
        finally:
            self.door.close()  # held requests get their 503 before the shutdown grace
            watcher.cancel()
            sweeper.cancel()
            if listener is not None:
                listener.close()
            await runner.cleanup()
            await self.forwarder.close()
            self.refusals.flush(loop.time(), force=True)

    async def _front(self, request: web.BaseRequest) -> web.StreamResponse:
        """Every request, past aiohttp's router: its expect handler ran before any route or
        middleware, and sent `100 Continue` to CONNECT and OPTIONS * (no route) before their
        404, and a 417 quoting the header; the forwarder tells 100 after the head's refusals."""
        assert isinstance(request, web.Request)  # (the application's request factory)
        answer = await self.forwarder.handle(request)  # (CONNECT, OPTIONS *: its JSON 404)
        if request.method == "CONNECT":  # what follows it is a tunnel's bytes, not a request
            answer.force_close()
        return answer

    def _count(self, reason: str) -> None:
        """One more shed connection or refused request, or a client that left (on the loop)."""
        setattr(self.stats, reason, getattr(self.stats, reason) + 1)
        if reason not in GUARD_REASONS:  # clients_left: the client's doing, not a refusal
            return self._log("debug", "gate.client_left", clients_left=self.stats.clients_left)
        self.refusals.count(reason)


# --- how the daemon attaches the gate: readiness from its snapshot, failures logged loudly ---

def upstream_of(config: Config) -> str:
    """Where the gate forwards to: vLLM's address, a wildcard by the one mapping
    (config/hosts.py; "::" is ::1, which an IPv6-only listener answers on)."""
    return f"http://{url_host(connect_host(config.vllm.host))}:{config.vllm.port}"


def start_gate(config: Config, log: LogFn, get_snapshot: Callable[[], Snapshot],
               max_connections: int = MAX_CONNECTIONS, spare_socket: str | None = None,
               audio: int | None = None) -> Gate | None:
    """Start the [gate] front door if enabled; None when off or when it could not start."""
    g = config.gate
    if not g.enabled:
        return None
    upstream = upstream_of(config)

    def readiness() -> Readiness:
        snap = get_snapshot()  # the spare proven awake (issue 34): new and held requests go
        return Readiness.OPEN if snap.serving == "spare" and snap.exit_code is None else \
            readiness_of(snap.state, snap.ready, snap.draining, snap.restart_phase,
                         exiting=snap.exit_code is not None)

    def failed(error: str) -> None:
        log("error", "gate.failed", error=error, listen=g.listen, hint="clients on gate.listen"
            f" get connection errors; vLLM still runs on vllm.port: {systemctl('restart')}")

    def generation() -> int | None:  # the engine the door is open for: the child's pid
        snap = get_snapshot()
        if snap.serving == "spare" and snap.spare is not None and snap.spare.get("pid"):
            return -int(snap.spare["pid"])  # the spare's own generation, never a child's
        return snap.child_pid

    gate = Gate(g.listen, upstream, readiness, g.hold_timeout, g.retry_after, failed, log=log,
                max_connections=max_connections, generation=generation)
    gate.forwarder.replay, gate.forwarder.replay_max = g.replay, g.replay_max
    gate.forwarder.new_engine(0, None, audio)  # its body cap until a launch's (pid 0: none)
    gate.forwarder.upstreams.keepalive = keepalive_of(config)
    if spare_socket is not None:  # the spare's plan is on: a second upstream
        gate.forwarder.spare_socket = spare_socket
        gate.forwarder.to_spare = lambda: get_snapshot().serving == "spare"
    try:
        gate.start()
    except GateError as exc:  # the daemon's start ends on it (daemon._gate_refused)
        log("error", "gate.failed", error=str(exc), listen=g.listen,
            hint="vllmwatch exits 69 before launching vLLM (its clients could not connect)")
        return gate
    log("info", "gate.listening", listen=g.listen, upstream=upstream,
        hold_timeout_s=g.hold_timeout, replay=g.replay, replay_max=g.replay_max,
        loop=gate.loop, upstream_keepalive_s=gate.forwarder.upstreams.keepalive)
    return gate


def with_gate(snap: Snapshot, gate: Gate | None) -> Snapshot:
    """The snapshot with the gate's live counters (for /status and the metrics)."""
    return snap if gate is None else dataclasses.replace(snap, gate=gate.snapshot())
