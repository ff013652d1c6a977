"""The [gate] front door against the fake vLLM: hold and release, hold timeout, streaming
pass-through chunk by chunk, vLLM dying mid-request, and the gate's own failures."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import pytest

from tests.support import TIMEOUT_SCALE, free_port, wait_until
from vllmwatch.gate import runner
from vllmwatch.gate.door import Door, Readiness, readiness_of
from vllmwatch.gate.runner import Gate, GateError

T = TypeVar("T")


@pytest.fixture(autouse=True, params=["asyncio", "uvloop"])
def loop_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every gate test on both event loops the gate can run on (uvloop when installed)."""
    if request.param == "uvloop":
        pytest.importorskip("uvloop", reason="uvloop not installed: the gate runs on asyncio")
    monkeypatch.setenv("VLLMWATCH_GATE_UVLOOP", "1" if request.param == "uvloop" else "0")
    return str(request.param)


def wait_for(check: Callable[[], T], timeout: float = 10.0, what: str = "condition") -> T:
    return wait_until(check, timeout * TIMEOUT_SCALE, what)  # a loaded box is slow


def post(port: int, body: dict[str, Any], timeout: float = 20.0 * TIMEOUT_SCALE
         ) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body); status 0 when the connection fails."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    except (OSError, http.client.HTTPException):
        return 0, {}, b""
    finally:
        conn.close()


def health(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


def running(port: int) -> float:
    """vllm:num_requests_running of the fake vLLM: the request reached its engine."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    except (OSError, http.client.HTTPException):
        return 0.0
    finally:
        conn.close()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running{"))


BODY = {"model": "fake", "prompt": "hello", "max_tokens": 3}


@contextmanager
def fake_vllm(port: int, *flags: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-m", "vllmwatch.testing.fake_vllm", "--port",
                             str(port), "--model", "fake", *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_for(lambda: health(port) == 200, 20, "the fake vLLM")
        yield proc
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10 * TIMEOUT_SCALE)


class Switch:
    """The daemon's readiness, set by the test."""

    def __init__(self, state: Readiness = Readiness.HOLD) -> None:
        self.state = state
        self.reads = 0  # how often the door looked (proof that it had its chance)

    def __call__(self) -> Readiness:
        self.reads += 1
        return self.state


@contextmanager
def gate(upstream_port: int, switch: Switch, hold: float = 10.0,
         on_error: Callable[[str], None] | None = None) -> Iterator[Gate]:
    g = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{upstream_port}", switch, hold,
             retry_after=7, on_error=on_error)
    g.start()
    try:
        yield g
    finally:
        g.stop()
        assert not g._thread.is_alive()


def test_the_gate_runs_on_the_chosen_loop(loop_kind: str) -> None:
    port = free_port()
    with fake_vllm(port), gate(port, Switch(Readiness.OPEN)) as g:
        assert post(g.port, BODY)[0] == 200
        assert g.snapshot()["loop"] == loop_kind == runner.loop_name()
        assert g._loop is not None and ("uvloop" in type(g._loop).__module__) == \
            (loop_kind == "uvloop")


def test_without_uvloop_the_gate_runs_on_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLMWATCH_GATE_UVLOOP", "1")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert runner.loop_factory() is None and runner.loop_name() == "asyncio"


def in_threads(n: int, fn: Callable[[], T]) -> tuple[list[T], list[threading.Thread]]:
    out: list[T] = []
    threads = [threading.Thread(target=lambda: out.append(fn())) for _ in range(n)]
    for t in threads:
        t.start()
    return out, threads


@pytest.mark.parametrize(("state", "ready", "draining", "want"), [
    ("ready", True, False, Readiness.OPEN),
    ("draining", True, True, Readiness.HOLD),
    ("starting", False, False, Readiness.HOLD),
    ("backoff", False, False, Readiness.HOLD),
    ("stopping", False, False, Readiness.HOLD),
    ("stopped", False, False, Readiness.CLOSED),
    ("failed", False, False, Readiness.CLOSED),
])
def test_readiness_of_the_snapshot(state: str, ready: bool, draining: bool,
                                   want: Readiness) -> None:
    assert readiness_of(state, ready, draining) == want


def test_door_releases_in_arrival_order() -> None:
    async def scenario() -> list[int]:
        switch = Switch()
        door = Door(switch, poll=0.01)
        order: list[int] = []

        async def one(i: int) -> None:  # the hold outlasts the waits below (scaled)
            assert await door.enter(60.0 * TIMEOUT_SCALE) is True
            order.append(i)

        tasks = []
        for i in range(20):
            tasks.append(asyncio.create_task(one(i)))
            await asyncio.sleep(0)  # each reaches the door before the next arrives
        watcher = asyncio.create_task(door.watch())
        reads = switch.reads

        async def polled() -> None:
            while switch.reads < reads + 2:  # the watcher read HOLD twice: nobody passed
                await asyncio.sleep(0.01)

        await asyncio.wait_for(polled(), 10 * TIMEOUT_SCALE)
        assert order == [] and door.waiting == 20
        switch.state = Readiness.OPEN
        await asyncio.wait_for(asyncio.gather(*tasks), 5 * TIMEOUT_SCALE)
        watcher.cancel()
        return order

    assert asyncio.run(scenario()) == list(range(20))


def test_hold_then_release_when_ready() -> None:
    port = free_port()
    switch = Switch(Readiness.HOLD)
    with fake_vllm(port), gate(port, switch) as g:
        out, threads = in_threads(4, lambda: post(g.port, BODY))
        wait_for(lambda: g.stats.holding == 4, what="4 requests held")
        assert out == [] and g.stats.forwarded == 0
        switch.state = Readiness.OPEN
        for t in threads:
            t.join(20 * TIMEOUT_SCALE)
        assert [r[0] for r in out] == [200] * 4
        assert g.stats.held == 4 and g.stats.forwarded == 4 and g.stats.hold_timeouts == 0


def test_hold_timeout_is_503_with_retry_after() -> None:
    port = free_port()
    with fake_vllm(port), gate(port, Switch(Readiness.HOLD), hold=0.5) as g:
        t0 = time.monotonic()
        status, headers, body = post(g.port, BODY)
        assert status == 503 and headers["Retry-After"] == "7"
        assert "gate.hold_timeout" in json.loads(body)["message"]
        assert 0.4 <= time.monotonic() - t0 < 15  # its 0.5 s, not the 120 s default
        assert g.stats.hold_timeouts == 1 and g.stats.forwarded == 0


def test_closed_refuses_at_once() -> None:
    port = free_port()
    with fake_vllm(port), gate(port, Switch(Readiness.CLOSED), hold=30) as g:
        # at once, not at the 30 s hold: a client's 5 s, scaled for a loaded box, below it
        status, headers, _ = post(g.port, BODY, timeout=min(5 * TIMEOUT_SCALE, 20.0))
        assert status == 503 and "Retry-After" in headers
        assert g.stats.refused_closed == 1


def test_streaming_passes_chunk_by_chunk() -> None:
    """The gate forwards each SSE event as vLLM sends it, never the stream at its end. The
    proof does not time the box: the client's first read that holds an event holds fewer than
    all of them (a buffering gate delivers all at once), with 2 s between vLLM's chunks."""
    port = free_port()
    with fake_vllm(port, "--stream-interval", "2.0"), gate(port, Switch(Readiness.OPEN)) as g:
        conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=60 * TIMEOUT_SCALE)
        conn.request("POST", "/v1/completions", json.dumps({**BODY, "max_tokens": 3,
                                                             "stream": True}))
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("Content-Type", "").startswith("text/event-stream")
        seen, buf = [], b""  # the events the client held after each read
        while chunk := resp.read1(65536):
            buf += chunk
            seen.append(buf.count(b"data: "))
        conn.close()
        events = [e for e in buf.split(b"\n\n") if e]
        assert len(events) == 4 and events[-1] == b"data: [DONE]"
        first = next(n for n in seen if n >= 1)
        assert first < len(events), f"all {len(events)} events came in one read: {seen}"


def test_failure_mid_request_is_counted_not_retried_with_replay_off() -> None:
    port = free_port()
    with fake_vllm(port, "--slow-completion", "5") as fake, \
            gate(port, Switch(Readiness.OPEN)) as g:
        g.forwarder.replay = False  # [gate] replay = false: today's 502 (test_gate_replay.py)
        out, threads = in_threads(1, lambda: post(g.port, BODY))
        wait_for(lambda: g.stats.in_flight == 1, what="the request in flight")
        # in_flight counts from before the gate connects upstream: a kill before the fake has
        # the request is a refused connection (held and tried again), not a mid-request loss
        wait_for(lambda: running(port) >= 1, what="the request running in the fake vLLM")
        os.killpg(fake.pid, signal.SIGKILL)
        threads[0].join(20 * TIMEOUT_SCALE)
        status, _, body = out[0]
        assert status == 502 and "replay is off" in json.loads(body)["message"]
        assert g.stats.failed_midrequest == 1 and g.stats.forwarded == 1
        assert g.stats.not_replayed == 1 and g.stats.replayed == 0


def test_refused_connection_waits_for_vllm_to_come_up() -> None:
    port = free_port()
    with gate(port, Switch(Readiness.OPEN), hold=30) as g:  # "ready" but nothing listens yet
        out, threads = in_threads(1, lambda: post(g.port, BODY, timeout=40 * TIMEOUT_SCALE))
        wait_for(lambda: g.stats.connect_retries >= 1, what="a refused connection")
        with fake_vllm(port):
            threads[0].join(30 * TIMEOUT_SCALE)
        assert out[0][0] == 200
        assert g.stats.failed_midrequest == 0 and g.stats.forwarded == 1


def test_listen_taken_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        g = Gate(f"127.0.0.1:{busy}", "http://127.0.0.1:1", Switch(), 1, 1)
        with pytest.raises(GateError, match=r"gate.listen .*cannot listen"):
            g.start()
        g.stop()


def test_a_dying_gate_reports_its_error() -> None:
    errors: list[str] = []

    def broken() -> Readiness:
        raise RuntimeError("snapshot unreadable")

    g = Gate(f"127.0.0.1:{free_port()}", "http://127.0.0.1:1", broken, 1, 1, errors.append)
    with suppress(GateError):  # it may die before or after it reports being up
        g.start()
    wait_for(lambda: g.error is not None, what="the gate's error")
    assert "snapshot unreadable" in (g.error or "") and not g.running
    g.stop()


@pytest.mark.parametrize(("gate", "key", "text"), [
    ({"enabled": True}, "gate.listen", "empty"),
    ({"enabled": True, "listen": "8000"}, "gate.listen", "no port"),
    ({"enabled": True, "listen": "0.0.0.0:99999"}, "gate.listen", "1 to 65535"),
    ({"enabled": True, "listen": "0.0.0.0:8000"}, "gate.listen", "is vllm.port"),
    ({"enabled": True, "listen": ":9000", "hold_timeout": "0s"}, "gate.hold_timeout",
     "0 is not accepted"),
    ({"enabled": "yes"}, "gate.enabled", "bad value"),
    ({"hold": "1s"}, "gate.hold", "unknown key"),
])
def test_gate_config_errors_name_the_key(gate: dict[str, Any], key: str, text: str) -> None:
    from vllmwatch.config.schema import ConfigError, from_dict

    with pytest.raises(ConfigError) as err:
        from_dict({"vllm": {"model": "/m", "port": 8000}, "gate": gate}, "/etc/vw.toml")
    assert err.value.key == key and text in str(err.value), str(err.value)


@pytest.mark.parametrize(("host", "listen"), [
    ("127.0.0.1", "localhost:8000"), ("0.0.0.0", "127.0.0.1:8000"),
    ("127.0.0.1", "0.0.0.0:8000"), ("::1", "[::1]:8000"), ("", "localhost:8000"),
])
def test_gate_listen_on_vllms_own_socket_by_any_name_is_refused(host: str, listen: str) -> None:
    """The gate binds first: on vLLM's socket under another name (localhost, a wildcard on
    either side) vLLM would find it busy at every start."""
    from vllmwatch.config.schema import ConfigError, from_dict

    with pytest.raises(ConfigError) as err:
        from_dict({"vllm": {"model": "/m", "host": host, "port": 8000},
                   "gate": {"enabled": True, "listen": listen}}, "/etc/vw.toml")
    assert err.value.key == "gate.listen" and "is vllm.port" in str(err.value), str(err.value)
    from_dict({"vllm": {"model": "/m", "host": "127.0.0.1", "port": 8000},  # another address
               "gate": {"enabled": True, "listen": "127.0.0.2:8000"}})


def test_gate_config_accepted_and_off_by_default() -> None:
    from vllmwatch.config.schema import from_dict

    assert from_dict({"vllm": {"model": "/m"}}).gate.enabled is False
    assert from_dict({"vllm": {"model": "/m"}}).drain.deregister_delay == 10.0
    c = from_dict({"vllm": {"model": "/m", "port": 8001},
                   "gate": {"enabled": True, "listen": "0.0.0.0:8000"}})
    assert c.gate.listen == "0.0.0.0:8000" and c.gate.hold_timeout == 120.0


def test_stop_with_requests_held_is_bounded() -> None:
    g = Gate(f"127.0.0.1:{free_port()}", "http://127.0.0.1:1", Switch(Readiness.HOLD), 300, 1)
    g.start()
    out, threads = in_threads(2, lambda: post(g.port, BODY, timeout=30 * TIMEOUT_SCALE))
    wait_for(lambda: g.stats.holding == 2, what="2 requests held")
    t0 = time.monotonic()
    g.stop()
    assert time.monotonic() - t0 < 9 and not g._thread.is_alive()
    for t in threads:
        t.join(10 * TIMEOUT_SCALE)
    assert sorted(r[0] for r in out) != [200, 200]  # cut, never forwarded
    assert g.stats.forwarded == 0


def test_a_reload_writes_the_gate_settings_on_the_gate_thread() -> None:
    """Issue 32 item 5: a SIGHUP's gate.hold_timeout, retry_after, replay and replay_max are
    written on the gate's own thread, where requests read them, never from the loop's."""
    port = free_port()
    with gate(port, Switch(Readiness.OPEN)) as g:
        writers: list[str] = []
        fwd = g.forwarder

        class Watched(type(fwd)):  # type: ignore[misc]
            def __setattr__(self, name: str, value: object) -> None:
                if name in ("hold_timeout", "retry_after", "replay", "replay_max"):
                    writers.append(threading.current_thread().name)
                super().__setattr__(name, value)

        fwd.__class__ = Watched
        g.reconfigure(3.0, 2.0, False, 3)
        wait_for(lambda: (fwd.hold_timeout, fwd.retry_after, fwd.replay, fwd.replay_max)
                 == (3.0, 2.0, False, 3), what="the new settings")
        assert writers == ["vllmwatch-gate"] * 4
