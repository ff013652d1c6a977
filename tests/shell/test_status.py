"""The status listener, its Prometheus metrics and `vllmwatch status`, on loopback."""

from __future__ import annotations

import dataclasses
import http.client
import io
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import TIMEOUT_SCALE, wait_for
from vllmwatch.status import cli as status_cli
from vllmwatch.status import metrics, stopped
from vllmwatch.status.server import StatusListenError, StatusServer, parse_listen
from vllmwatch.status.snapshot import MemoryFigures, Snapshot

T0 = 1000.0


def make_snapshot(**changes: Any) -> Snapshot:
    """A busy, ready daemon with every figure filled in."""
    base = Snapshot(
        state="ready", state_since=time.time() - 90, state_since_monotonic=T0 - 90,
        ready=True, child_pid=4242, child_uptime_s=95.0,
        restarts_by_reason={"hang": 1, "leak-gpu": 2}, last_reason="leak-gpu",
        last_reason_detail="tree 71.0GiB > 70.0GiB", last_restart_at=time.time() - 100,
        start_phases_s={"spawn": 0.2, "load": 41.5, "warmup": 3.0},
        memory=MemoryFigures(
            source="nvml-process", gpu_tree_mib=70000.0,
            gpu_tree_by_gpu_mib={0: 35000.0, 1: 35000.0},
            device_used_mib={0: 36000.0, 1: 36500.0}, device_total_mib={0: 81559.0, 1: 81559.0},
            host_rss_mib=4096.0, host_pss_mib=3900.0, gpu_baseline_mib=69000.0,
            host_baseline_mib=3800.0, gpu_slope_mib_per_h=12.0, host_slope_mib_per_h=None,
            gpu_rule_mib=70000.0, host_rule_mib=3900.0, gpu_limit_mib=70 * 1024.0),
        vllm_running=3.0, vllm_waiting=1.0, vllm_kv_cache_usage=0.25,
        probe_seconds={"health": 0.012, "canary": 0.4}, probe_failures={"health": 2},
        probe_last_completed={"health": 1.7e9, "canary": 1.7e9 - 30}, model="tiny-model",
        stale_probes=("memory",),
        config_path="/etc/vllmwatch/vllmwatch.toml", config_sha256="ab" * 32,
        vllm_version="0.6.3", loop_heartbeat=T0)
    return dataclasses.replace(base, **changes)


class Harness:
    """A running server over a replaceable snapshot, a fake clock and captured events."""

    def __init__(self, snap: Snapshot, **kwargs: Any) -> None:
        self.snap = snap
        self.clock = T0
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.server = StatusServer(
            kwargs.pop("listen", "127.0.0.1:0"), kwargs.pop("allow_remote", False),
            lambda: self.snap, lambda level, event, **kw: self.events.append((event, kw)),
            now=kwargs.pop("now", lambda: self.clock), **kwargs)

    @property
    def url(self) -> str:
        host, port = self.server.address
        return f"http://{host}:{port}"

    def request(self, path: str, method: str = "GET",
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        host, port = self.server.address
        conn = http.client.HTTPConnection(host, port, timeout=5 * TIMEOUT_SCALE)
        try:
            conn.request(method, path, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()


@contextmanager
def running(snap: Snapshot | None = None, **kwargs: Any) -> Iterator[Harness]:
    harness = Harness(snap or make_snapshot(), **kwargs)
    harness.server.start()
    try:
        yield harness
    finally:
        harness.server.stop()


# --- parse_listen and binding ---------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("", None),
    ("  ", None),
    ("127.0.0.1:9101", ("127.0.0.1", 9101)),
    ("[::1]:9101", ("::1", 9101)),
    (":9101", ("", 9101)),
    ("localhost:0", ("localhost", 0)),
])
def test_parse_listen(text: str, expected: tuple[str, int] | None) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["9101", "127.0.0.1", "::1:9101", "[::1]9101", "[::1",
                                  "host:x", "127.0.0.1:70000", "127.0.0.1:-1"])
def test_parse_listen_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen(text)


@pytest.mark.parametrize("listen", ["0.0.0.0:0", ":0"])
def test_non_loopback_refused_without_allow_remote(listen: str) -> None:
    server = StatusServer(listen, False, make_snapshot, lambda *a, **k: None)
    with pytest.raises(StatusListenError, match=r"status\.listen.*0\.0\.0\.0.*allow_remote"):
        server.start()


def test_bad_and_busy_addresses_are_clear_errors() -> None:
    with pytest.raises(StatusListenError, match=r"status\.listen = '127\.0\.0\.1'.*no port"):
        StatusServer("127.0.0.1", False, make_snapshot, lambda *a, **k: None).start()
    with running() as h:
        port = h.server.address[1]
        other = StatusServer(f"127.0.0.1:{port}", False, make_snapshot, lambda *a, **k: None)
        with pytest.raises(StatusListenError, match=rf"status\.listen.*127\.0\.0\.1:{port}"):
            other.start()
    assert ("status.listening", {"address": f"127.0.0.1:{port}", "allow_remote": False}) \
        in h.events


def test_ipv6_loopback_and_allow_remote_on_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        with running(listen="[::1]:0", allow_remote=True) as h:
            assert h.server.address[0] == "::1"
            assert h.request("/livez")[0] == 200
    except StatusListenError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")


# --- endpoints ------------------------------------------------------------------------------

def test_livez_follows_the_loop_heartbeat() -> None:
    with running() as h:
        assert h.request("/livez")[0] == 200
        h.clock = T0 + 30.0
        assert h.request("/livez")[0] == 200
        h.clock = T0 + 31.0
        code, _, body = h.request("/livez")
        assert code == 503
        assert b"31.0s ago" in body
        h.snap = dataclasses.replace(h.snap, loop_heartbeat=T0 + 31.0)
        assert h.request("/livez")[0] == 200


def test_readyz_flips_with_ready_and_draining() -> None:
    with running(make_snapshot(state="starting", ready=False)) as h:
        code, _, body = h.request("/readyz")
        assert (code, body) == (503, b"not ready: state=starting draining=false\n")
        h.snap = dataclasses.replace(h.snap, state="ready", ready=True)
        assert h.request("/readyz")[:3:2] == (200, b"ready\n")
        h.snap = dataclasses.replace(h.snap, state="draining", draining=True)
        code, _, body = h.request("/readyz")
        assert code == 503
        assert b"state=draining draining=true" in body


@pytest.mark.parametrize(("reason", "said"), [(None, b" start=launching\n"),
                                               ("crash", b" restart=launching\n")])
def test_readyz_names_the_first_starts_rung_as_no_restart(reason: str | None,
                                                          said: bytes) -> None:
    """The first start read `not ready: state=starting draining=false restart=launching`."""
    with running(make_snapshot(state="starting", ready=False, restart_phase="launching",
                               restart_reason=reason)) as h:
        code, _, body = h.request("/readyz")
        assert code == 503 and body.endswith(said), body


def test_status_is_the_snapshot_plus_state_for_s() -> None:
    with running() as h:
        h.clock = T0 + 10
        code, headers, body = h.request("/status?pretty=1")
        assert code == 200
        assert headers["Content-Type"] == "application/json"
        assert headers["Cache-Control"] == "no-store"
        data = json.loads(body)
        assert data.pop("state_for_s") == pytest.approx(100.0)
        assert data == json.loads(json.dumps(h.snap.to_json()))
        assert data["memory"]["gpu_tree_by_gpu_mib"] == {"0": 35000.0, "1": 35000.0}
        assert data["restarts_total"] == 3


def test_state_for_s_without_a_monotonic_stamp() -> None:
    with running(make_snapshot(state_since_monotonic=None)) as h:
        assert json.loads(h.request("/status")[2])["state_for_s"] == pytest.approx(90, abs=5)
    with running(make_snapshot(state_since_monotonic=None, state_since=0.0)) as h:
        assert json.loads(h.request("/status")[2])["state_for_s"] is None


def _families(body: bytes) -> dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    out: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        samples = out.setdefault(family.name, {})
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_parse_back_with_the_values() -> None:
    with running() as h:
        code, headers, body = h.request("/metrics")
    assert code == 200
    assert headers["Content-Type"].startswith("text/plain")
    fam = _families(body)
    gib = 2.0**30
    assert fam["vllmwatch_state"][("vllmwatch_state", (("state", "ready"),))] == 1.0
    assert sum(fam["vllmwatch_state"].values()) == 1.0
    assert len(fam["vllmwatch_state"]) == 10
    assert fam["vllmwatch_ready"] == {("vllmwatch_ready", ()): 1.0}
    # every restart reason of core/names.py is there from the start (0), plus any other seen
    assert fam["vllmwatch_restarts"] == {
        ("vllmwatch_restarts_total", (("reason", r),)): float(
            {"hang": 1, "leak-gpu": 2}.get(r, 0))
        for r in (*metrics.RESTART_REASONS, "leak-gpu")}
    assert fam["vllmwatch_child_uptime_seconds"] == {("vllmwatch_child_uptime_seconds", ()): 95.0}
    gpu = fam["vllmwatch_gpu_memory_bytes"]
    assert gpu[("vllmwatch_gpu_memory_bytes", (("gpu", "1"),))] == 35000 * 2**20
    used = fam["vllmwatch_gpu_device_used_bytes"]
    assert used[("vllmwatch_gpu_device_used_bytes", (("gpu", "1"),))] == 36500 * 2**20
    host = fam["vllmwatch_host_memory_bytes"]
    assert host[("vllmwatch_host_memory_bytes", (("kind", "rss"),))] == 4 * gib
    assert fam["vllmwatch_memory_baseline_bytes"][
        ("vllmwatch_memory_baseline_bytes", (("kind", "gpu"),))] == 69000 * 2**20
    # host slope is None: that series is omitted, not reported as 0
    assert fam["vllmwatch_memory_slope_bytes_per_second"] == {
        ("vllmwatch_memory_slope_bytes_per_second", (("kind", "gpu"),)): 12 * 2**20 / 3600}
    assert fam["vllmwatch_memory_rule_bytes"] == {
        ("vllmwatch_memory_rule_bytes", (("kind", "gpu"),)): 70000 * 2**20,
        ("vllmwatch_memory_rule_bytes", (("kind", "host"),)): 3900 * 2**20}
    assert fam["vllmwatch_memory_limit_bytes"] == {
        ("vllmwatch_memory_limit_bytes", (("kind", "gpu"),)): 70 * gib}
    assert fam["vllmwatch_probe_last_completed_timestamp_seconds"][
        ("vllmwatch_probe_last_completed_timestamp_seconds", (("probe", "health"),))] == 1.7e9
    assert fam["vllmwatch_probe_stale"] == {
        ("vllmwatch_probe_stale", (("probe", k),)): 1.0 if k == "memory" else 0.0
        for k in ("canary", "health", "memory", "metrics")}
    assert fam["vllmwatch_status_rejected"] == {
        ("vllmwatch_status_rejected_total", (("reason", r),)): 0.0
        for r in ("busy", "timeout", "overflow", "too_large", "no_fds", "bad_request")}
    assert fam["vllmwatch_probe_duration_seconds"][
        ("vllmwatch_probe_duration_seconds", (("probe", "canary"),))] == 0.4
    assert fam["vllmwatch_probe_failures"] == {
        ("vllmwatch_probe_failures_total", (("probe", "health"),)): 2.0}
    assert fam["vllmwatch_startup_phase_reached_seconds"][
        ("vllmwatch_startup_phase_reached_seconds", (("phase", "load"),))] == 41.5
    assert "vllmwatch_startup_seconds" not in fam  # renamed: it never held durations
    assert fam["vllmwatch_vllm_requests_running"] == {
        ("vllmwatch_vllm_requests_running", ()): 3.0}
    assert fam["vllmwatch_vllm_requests_waiting"] == {
        ("vllmwatch_vllm_requests_waiting", ()): 1.0}
    assert fam["vllmwatch_vllm_kv_cache_usage_ratio"] == {
        ("vllmwatch_vllm_kv_cache_usage_ratio", ()): 0.25}
    ((name, labels), value), = fam["vllmwatch_info"].items()
    assert (name, value) == ("vllmwatch_info", 1.0)
    assert dict(labels) == {"version": h.snap.vllmwatch_version, "vllm_version": "0.6.3",
                            "config_sha256": "ab" * 32, "model": "tiny-model",
                            **metrics.host_identity()}
    assert ("process_resident_memory_bytes", ()) in fam["process_resident_memory_bytes"]


def test_metrics_omit_unknown_values_and_keep_odd_states() -> None:
    snap = Snapshot(state="weird", loop_heartbeat=T0)
    with running(snap) as h:
        fam = _families(h.request("/metrics")[2])
    assert fam["vllmwatch_state"][("vllmwatch_state", (("state", "weird"),))] == 1.0
    assert fam["vllmwatch_state"][("vllmwatch_state", (("state", "ready"),))] == 0.0
    assert fam["vllmwatch_ready"] == {("vllmwatch_ready", ()): 0.0}
    for name in ("vllmwatch_child_uptime_seconds", "vllmwatch_vllm_requests_running",
                 "vllmwatch_vllm_kv_cache_usage_ratio"):
        assert fam[name] == {}  # declared, without a sample: unknown is not 0
    for name in ("vllmwatch_gpu_memory_bytes", "vllmwatch_host_memory_bytes"):
        assert not fam.get(name)
    # no restart yet is a known 0 for every reason (as the states), not an absent series
    assert set(fam["vllmwatch_restarts"].values()) == {0.0}
    assert len(fam["vllmwatch_restarts"]) == len(metrics.RESTART_REASONS)
    assert dict(next(iter(fam["vllmwatch_info"]))[1])["vllm_version"] == ""


def test_metrics_honour_an_openmetrics_accept_header() -> None:
    with running() as h:
        code, headers, body = h.request(
            "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert code == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


def test_head_index_and_not_found() -> None:
    with running() as h:
        code, headers, body = h.request("/status", method="HEAD")
        assert (code, body) == (200, b"")
        assert int(headers["Content-Length"]) > 100
        assert h.request("/")[0] == 200
        code, _, body = h.request("/nope")
        assert code == 404
        assert b"/metrics" in body


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "FROB"])
def test_other_methods_are_refused(method: str) -> None:
    with running() as h:
        code, headers, body = h.request("/status", method=method)
    assert code == 405
    assert headers["Allow"] == "GET, HEAD"
    assert b"read-only" in body


def test_a_failing_snapshot_is_a_500_and_an_event() -> None:
    def broken() -> Snapshot:
        raise RuntimeError("boom")

    with running() as h:
        h.server.get_snapshot = broken
        code, _, _ = h.request("/status")
    assert code == 500
    assert ("status.handler_failed", {"path": "/status", "error": "RuntimeError('boom')"}) \
        in h.events


# --- slow, idle and excess clients ----------------------------------------------------------

def _trickle(sock: socket.socket, data: bytes, pause: float, limit_s: float) -> float | None:
    """Send data a byte at a time; return when the server closed us (seconds) or None."""
    start = time.monotonic()
    for i in range(len(data)):
        if time.monotonic() - start > limit_s:
            return None
        try:
            sock.send(data[i:i + 1])
            readable, _, _ = select.select([sock], [], [], pause)
            if readable and not sock.recv(4096):
                return time.monotonic() - start
        except OSError:
            return time.monotonic() - start
    return None


def _slowloris(port: int, idle: bool, limit_s: float) -> float | None:
    with socket.create_connection(("127.0.0.1", port), timeout=limit_s) as sock:
        if idle:  # connects and says nothing
            start = time.monotonic()
            try:
                readable, _, _ = select.select([sock], [], [], limit_s)
                return time.monotonic() - start if readable and not sock.recv(1) else None
            except OSError:
                return time.monotonic() - start
        headers = b"GET /status HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 1000
        return _trickle(sock, headers, 0.05, limit_s)


def test_a_slow_client_is_cut_off_at_the_deadline() -> None:
    with running(client_timeout=0.5) as h:
        port = h.server.address[1]
        # Cut at the 0.5 s deadline, not at the client's own 8 s: the margin is for a loaded box.
        assert (_slowloris(port, idle=False, limit_s=8) or 99) < 4.0
        assert (_slowloris(port, idle=True, limit_s=8) or 99) < 4.0
        wait_for(lambda: h.server.slots.active == 0, 5, "handler slots to be free")
        assert h.request("/livez")[0] == 200


def test_stress_never_stalls_the_loop() -> None:
    """50 clients hammering and 10 slow or idle ones; a 50 ms loop keeps its cadence.

    The slow ones hold their connection until the 10 s client deadline: a loop or a request
    queued behind them would wait that long, so the bounds below (1 s and 2.5 s, times the
    suite's TIMEOUT_SCALE for a loaded box: 3 s and 7.5 s) still tell blocked from served."""
    stop = threading.Event()
    gaps: list[float] = []
    deadline = 10.0
    with running(max_clients=64, client_timeout=deadline, now=time.monotonic) as h:
        port = h.server.address[1]

        def loop() -> None:  # the daemon's loop: publish a snapshot every 50 ms
            last = time.monotonic()
            while not stop.wait(0.05):
                now = time.monotonic()
                gaps.append(now - last)
                last = now
                h.snap = dataclasses.replace(h.snap, loop_heartbeat=now, child_uptime_s=now)

        cut_after: list[float | None] = []
        latencies: list[float] = []
        failures: list[str] = []
        lock = threading.Lock()
        start = threading.Barrier(50)

        def slow(i: int) -> None:
            result = _slowloris(port, idle=i % 2 == 0, limit_s=3 * deadline)
            with lock:
                cut_after.append(result)

        def client(i: int) -> None:
            paths = ("/status", "/metrics", "/livez", "/readyz")
            start.wait(5 * TIMEOUT_SCALE)  # 50 threads started on a loaded box: it scales
            for n in range(8):
                began = time.monotonic()
                try:
                    code, _, _ = h.request(paths[(i + n) % 4])
                except OSError as exc:
                    code = 0
                    with lock:
                        failures.append(repr(exc))
                with lock:
                    latencies.append(time.monotonic() - began)
                    if code != 200:
                        failures.append(f"{paths[(i + n) % 4]} -> {code}")

        threads = [threading.Thread(target=loop)]
        threads += [threading.Thread(target=slow, args=(i,)) for i in range(10)]
        threads += [threading.Thread(target=client, args=(i,)) for i in range(50)]
        # The loop has published once before any client asks: a thread starved for its
        # first 50 ms left the harness's initial snapshot, whose heartbeat reads stale.
        h.snap = dataclasses.replace(h.snap, loop_heartbeat=time.monotonic())
        threads[0].start()
        wait_for(lambda: gaps, 10, "the loop's first turn")
        for t in threads[1:11]:
            t.start()
        # The slow ones are in first: all ten held by the server (heads not complete), or
        # already cut at the deadline on a box slow enough to take that long to start them.
        wait_for(lambda: h.server.waiting + sum(h.server.rejections.totals.values()) >= 10,
                 10, "the slow clients to be held")
        for t in threads[11:]:
            t.start()
        for t in threads[1:]:
            t.join(timeout=6 * deadline * TIMEOUT_SCALE)
        stop.set()
        threads[0].join(timeout=10 * TIMEOUT_SCALE)
        assert not any(t.is_alive() for t in threads)
        wait_for(lambda: h.server.slots.active == 0, 3, "handler slots to be free")
    assert failures == []
    assert len(latencies) == 400
    assert max(latencies) < 2.5 * TIMEOUT_SCALE < deadline, \
        f"slowest request {max(latencies):.3f}s"
    assert len(gaps) > 10
    assert max(gaps) < 1.0 * TIMEOUT_SCALE < deadline, f"loop gaps: max {max(gaps):.3f}s"
    assert len(cut_after) == 10
    assert all(c is not None and c < deadline + 2.5 * TIMEOUT_SCALE for c in cut_after), \
        cut_after


# --- `vllmwatch status` ---------------------------------------------------------------------

def test_cli_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    with running() as h:
        assert status_cli.main(None, h.url, as_json=False) == 0
    out = capsys.readouterr().out
    assert "\033[" not in out  # not a TTY
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert "ready for 1m30s" in lines["state"]
    assert "pid 4242, up 1m35s" in lines["child"]
    assert "3 (hang 1, leak-gpu 2)" in lines["restarts"]
    assert "leak-gpu: tree 71.0GiB > 70.0GiB" in lines["last"]
    assert "spawn at +0.2s, load at +42s, warmup at +3s" in lines["startup"]  # offsets
    assert "model tiny-model" in lines["serving"]
    assert "failed: health 2; STALE (no result in time): memory" in lines["probes"]
    assert "tree 34.2GiB, device 35.6GiB / 79.6GiB" in out
    assert "rss 4.0GiB, pss 3.8GiB" in out
    assert "gpu +12MiB/h" in out
    assert "running 3, waiting 1, KV cache 25%" in lines["vLLM"]
    assert "/etc/vllmwatch/vllmwatch.toml (sha256 abababababab)" in lines["config"]
    assert "vLLM 0.6.3" in lines["versions"]


def test_cli_json_round_trips(capsys: pytest.CaptureFixture[str]) -> None:
    with running() as h:
        assert status_cli.main(None, h.url + "/", as_json=True) == 0
        raw = h.request("/status")[2].decode()
    assert capsys.readouterr().out == raw


@pytest.mark.parametrize("booted", [True, False])
def test_cli_when_not_running(capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch, booted: bool) -> None:
    """Where systemd runs, the systemctl command; in a container without it (where a
    systemctl command starts nothing), the foreground command for the same config."""
    monkeypatch.setattr(stopped, "systemd_booted", lambda: booted)
    monkeypatch.setattr(stopped, "systemd_view", lambda unit, booted=None: None)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert status_cli.main(None, f"127.0.0.1:{port}", as_json=False) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"vllmwatch is not running (no answer at http://127.0.0.1:{port}/"
                          "status)")
    assert ("systemctl start vllmwatch" in err) is booted
    assert ("`vllmwatch run --config /etc/vllmwatch/vllmwatch.toml`" in err) is not booted


def test_cli_http_error_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with running() as h:
        assert status_cli.main(None, h.url + "/nope", as_json=False) == 1
    assert "HTTP 404" in capsys.readouterr().err


def test_cli_url_from_config(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with running() as h:
        path = tmp_path / "vllmwatch.toml"
        path.write_text(f'[vllm]\nmodel = "m"\n[status]\nlisten = "{h.server.address[0]}:'
                        f'{h.server.address[1]}"\n')
        assert status_cli.main(str(path), None, as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "ready"
    path.write_text('[vllm]\nmodel = "m"\n[status]\nlisten = ""\n')
    assert status_cli.main(str(path), None, as_json=False) == 2
    assert "disables the status listener" in capsys.readouterr().err
    path.write_text('[vllm]\nmodel = "m"\n[status]\nlisten = ":9101"\nallow_remote = true\n')
    assert status_cli.url_from_config(str(path)) == "http://127.0.0.1:9101"
    path.write_text('[vllm]\nmodel = "m"\n[status]\nlisten = "[::1]:9102"\n')
    assert status_cli.url_from_config(str(path)) == "http://[::1]:9102"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_cli_colour_only_on_a_tty_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert status_cli.use_colour(_Tty())
    assert not status_cli.use_colour(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not status_cli.use_colour(_Tty())
    for state, code in (("ready", "32"), ("starting", "33"), ("draining", "33"),
                        ("failed", "31")):
        assert f"\033[{code}m{state}\033[0m" in status_cli.render({"state": state}, colour=True)


def test_cli_renders_a_sparse_document() -> None:
    text = status_cli.render({"state": "init"})
    assert "child     none" in text
    assert "vLLM" in text and "no scrape yet" in text


# --- the snapshot's probe freshness -----------------------------------------------------------

def test_probe_completions_are_wall_clock_and_outlive_their_child() -> None:
    from vllmwatch.config.schema import VllmConfig
    from vllmwatch.core.state import ChildRun, Probes
    from vllmwatch.status.statusline import completions

    def to_wall(t: float) -> float:
        return 1.7e9 + t  # monotonic 0 was this wall-clock time

    old = ChildRun(gen=1, started=0.0, vllm=VllmConfig(),
                   probes=Probes(done_at={"health": 10.0, "canary": 12.0}))
    first = completions(old, Snapshot(), to_wall)
    assert first == {"health": 1.7e9 + 10, "canary": 1.7e9 + 12}
    new = ChildRun(gen=2, started=50.0, vllm=VllmConfig(),
                   probes=Probes(done_at={"health": 60.0}))
    second = completions(new, Snapshot(probe_last_completed=first), to_wall)
    assert second == {"health": 1.7e9 + 60, "canary": 1.7e9 + 12}  # canary: from the old child
    assert completions(None, Snapshot(probe_last_completed=second), to_wall) == second


@pytest.mark.parametrize(("cgroup", "unit"), [
    ("0::/system.slice/vllmwatch.service\n", "vllmwatch.service"),
    ("0::/system.slice/system-vllmwatch.slice/vllmwatch@gpu1.service\n", "vllmwatch@gpu1.service"),
    ("12:pids:/system.slice/vllmwatch.service\n11:cpu:/\n", "vllmwatch.service"),
    ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/term.scope\n", ""),
    ("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope\n", ""),
    ("0::/\n", ""),
    ("", ""),
])
def test_the_unit_label_comes_from_our_own_cgroup(cgroup: str, unit: str) -> None:
    assert metrics.systemd_unit(cgroup) == unit


def test_instance_name_prefers_the_environment() -> None:
    assert metrics.host_identity({"VLLMWATCH_INSTANCE_NAME": "pod-7"})["instance_name"] == "pod-7"
    ident = metrics.host_identity({})
    assert ident["instance_name"] in (ident["host"], f"{ident['host']}/{ident['unit']}")


def test_cli_shows_the_standby_and_how_the_child_was_launched() -> None:
    text = status_cli.render({"state": "ready", "ready": True, "child_pid": 5,
                              "child_uptime_s": 70, "launch": "standby",
                              "standby_state": "waiting", "standby_pid": 7,
                              "standby_rss_mib": 608.4, "standby_reason": "an old discard"})
    assert "child     pid 5, up 1m10s (standby launch)" in text
    assert "standby   waiting, pid 7, rss 608MiB\n" in text  # no stale discard reason
    off = status_cli.render({"state": "ready", "standby_state": "off",
                             "standby_reason": "CPU config (vllm.gpus = [])"})
    assert "standby   off: CPU config (vllm.gpus = [])" in off
    assert "standby" not in status_cli.render({"state": "init"})  # an older daemon: no row


def test_a_config_this_user_may_not_read_says_sudo_not_fix_it() -> None:
    """After `sudo vllmwatch init` the config is 0640 root:vllmwatch; README's and init's
    `vllmwatch status` by an operator of neither said "cannot load the config ... (fix the
    config, or pass --url)": a good file, and advice to change it. It says to read it as
    root (or pass --url)."""
    import os
    import shutil
    import tempfile

    top = tempfile.mkdtemp(prefix="vw-status-", dir="/tmp")
    try:
        os.chmod(top, 0o755)
        path = os.path.join(top, "vllmwatch.toml")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write('[vllm]\nmodel = "/m"\n')
        os.chmod(path, 0o640 if os.geteuid() == 0 else 0)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: an operator neither root nor in the file's group
            code = 1
            try:
                os.close(read)
                if os.geteuid() == 0:
                    os.setgroups([])
                    os.setresgid(65534, 65534, 65534)
                    os.setresuid(65534, 65534, 65534)
                try:
                    status_cli.url_from_config(path)
                    said = "no error"
                except status_cli.StatusError as exc:
                    said = str(exc)
                os.write(write, json.dumps(said).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        with os.fdopen(read, "rb") as fh:
            said = json.loads(fh.read())
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    finally:
        shutil.rmtree(top)
    assert "sudo vllmwatch status" in said and "--url" in said, said
    assert "fix the config" not in said, said


def test_a_lone_surrogate_in_the_gates_error_is_answered_escaped_never_a_500() -> None:
    """The gate's error (an OSError's path, read from argv or /proc with surrogateescape) was
    encoded strictly after redaction: /readyz raised, and answered 500 'internal error'
    instead of its 503 and its reason; the secret beside it stays hidden."""
    snap = Snapshot(loop_heartbeat=T0, gate={"running": False,
                                             "error": "bind /run/g\udcff: api_key=K3yS3cret9"})
    server = StatusServer("127.0.0.1:0", False, lambda: snap, lambda *_a, **_k: None,
                          now=lambda: T0)  # respond() only: never bound
    for path in ("/readyz", "/status", "/livez", "/metrics"):
        code, _, body = server.respond(path)
        assert code != 500 and b"K3yS3cret9" not in body, (path, body)
    assert server.respond("/readyz")[2].startswith(b"not ready: gate down: bind /run/g\\udcff")
