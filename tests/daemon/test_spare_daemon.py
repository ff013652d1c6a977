"""The sleeping spare engine (issue 34) in a real `vllmwatch run` process over a fake GPU
(vllmwatch/testing/gpu_run.py: the fake NVML reads the ledger the fake vLLMs write): the
spare is built and asleep before the serving engine; when the serving tree dies (EngineCore
SIGKILL, API server SIGKILL) or hangs (EngineCore SIGSTOP), clients of the gate keep their
answers from the woken spare, the spare is re-armed (asleep again) once the full engine is
READY, and a stop leaves no process of either tree, no port and no socket. A spare that dies
is noticed and rebuilt. With an API key throughout: the spare's canary sends it, the clients
send it through the gate, and the spare's output (logged, tagged engine="spare") never
shows it.

What a failover may cost a client, by design: nothing, except a streamed answer that had
begun at an API server that was SIGKILLed (its bytes went to the client: the gate cannot
replay it). The gate holds new requests until the spare is
proven awake and replays a request that got no byte from the dead or hung engine, so for an
EngineCore death or hang no request may fail, and for an API server death only such cut
streams. Timings are printed (`-s`), never asserted.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import (
    PYTHON,
    TIMEOUT_SCALE,
    Daemon,
    base_config,
    dead,
    free_port,
    merge,
    port_free,
    sigstop,
    wait_for,
)
from tests.support.models import sparse_8b
from vllmwatch.testing import fake_gpu
from vllmwatch.testing.daemon import run_argv

# The fake vLLM, saying first which API key it got (as vLLM's "non-default args" line does):
# a spare's line that must reach the log tagged and redacted.
SCRIPT = "#!{python}\nimport os, sys\nfrom vllmwatch.testing.fake_vllm import main\n" \
         "print('api key:', os.environ.get('VLLM_API_KEY'), flush=True)\n" \
         "if __name__ == '__main__':\n    sys.exit(main())\n"
KEY = "sk-SpareKey0123456789"
WEIGHTS_MIB = 2048  # the model's (sparse) weights: the spare's pinned host backup, planned
WAIT = 30.0
STREAMS = 2  # clients that stream; as many send plain completions


def _model(tmp: Path) -> str:
    return sparse_8b(tmp, WEIGHTS_MIB)


class Spared:
    """One daemon with the gate and the spare on, over a fake H200 ledger."""

    def __init__(self, tmp: Path) -> None:
        script = tmp / "vllm"
        script.write_text(SCRIPT.format(python=PYTHON))
        script.chmod(0o755)
        self.ledger = fake_gpu.create(str(tmp / "gpu"))
        self.gate_port = free_port()
        self.model = _model(tmp)
        cfg = merge(base_config(free_port(), free_port()), {
            "vllm": {"command": [str(script), "--startup-seconds", "0.3", "--fake-weights-mib",
                                 str(WEIGHTS_MIB)],
                     "model": self.model, "gpus": [0], "args": {"max-model-len": 4096}},
            "gate": {"enabled": True, "listen": f"127.0.0.1:{self.gate_port}",
                     "hold_timeout": "30s"},
            "spare": {"enabled": "true"},
            "restart": {"standby": "false"},
            "drain": {"deregister_delay": "0s"},
        })
        (tmp / "key").write_text(KEY + "\n")
        (tmp / "key").chmod(0o600)
        cfg["vllm"]["api_key_file"] = str(tmp / "key")
        self.cfg, self.key, self.tmp = cfg, KEY, tmp
        argv = run_argv(tmp / "vllmwatch.toml", (PYTHON, "-m", "vllmwatch.testing.gpu_run",
                                                 self.ledger))
        self.d = Daemon(tmp, cfg, argv=argv, own_session=True)
        self.outcomes: list[str] = []
        self._stop = threading.Event()
        self._clients: list[threading.Thread] = []

    # ---- the daemon ----

    def start(self) -> None:
        self.d.start()
        self.d.wait_ready(WAIT)
        try:
            wait_for(lambda: self.spare().get("state") == "asleep", WAIT, "the spare asleep")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.d.dump()}") from None

    def status(self) -> dict[str, Any]:
        return json.loads(self.d.http_get("/status")[1])  # type: ignore[no-any-return]

    def spare(self) -> dict[str, Any]:
        return self.status().get("spare") or {}

    def child_pid(self) -> int:
        return int(self.d.named("child.started")[-1]["pid"])

    def engine_pid(self) -> int:
        """The serving tree's EngineCore (the fake's `--role engine` process)."""
        kids = psutil.Process(self.child_pid()).children(recursive=True)
        [engine] = [p.pid for p in kids if "engine" in p.cmdline()]
        return engine

    # ---- clients through the gate ----

    def clients(self, n: int = 2 * STREAMS) -> None:
        """n clients, each a closed loop of completions through the gate (half streamed)."""
        for k in range(n):
            t = threading.Thread(target=self._client, args=(k % 2 == 1,), daemon=True)
            t.start()
            self._clients.append(t)

    def _client(self, stream: bool) -> None:
        body = json.dumps({"model": self.model, "prompt": "a b c", "max_tokens": 4,
                           "stream": stream})
        while not self._stop.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", self.gate_port,
                                              timeout=60 * TIMEOUT_SCALE)
            began = time.time()
            try:
                conn.request("POST", "/v1/completions", body,
                             {"Content-Type": "application/json",
                              "Authorization": f"Bearer {self.key}"})
                resp = conn.getresponse()
                try:
                    data = resp.read()
                except http.client.IncompleteRead as exc:  # a chunked body with no end
                    self.outcomes.append(f"stream cut after {len(exc.partial)} bytes")
                    continue
                if resp.status == 200 and (b"[DONE]" in data if stream else b'"choices"' in
                                           data):
                    self.outcomes.append("ok")
                elif resp.status == 200 and stream:  # its head came, then it was cut
                    self.outcomes.append(f"stream cut after {len(data)} bytes")
                else:
                    self.outcomes.append(f"HTTP {resp.status} {data[:120]!r} stream={stream}")
            except (OSError, http.client.HTTPException) as exc:
                self.outcomes.append(f"{type(exc).__name__}: {exc} stream={stream} "
                                     f"sent at {began:.3f}")
            finally:
                conn.close()

    def more(self, n: int, what: str) -> None:
        now = len(self.outcomes)
        wait_for(lambda: len(self.outcomes) >= now + n, WAIT, what)

    def end_clients(self) -> list[str]:
        self._stop.set()
        for t in self._clients:
            t.join(70 * TIMEOUT_SCALE)
        return [o for o in self.outcomes if o != "ok"]

    # ---- the end ----

    def close(self) -> None:
        self._stop.set()
        sock = next((e.get("uds") for e in self.d.named("spare.plan")), None)
        self.d.close()  # asserts no process of either tree is left (either marker)
        # The spare's output reaches the log as the serving child's does: tagged, redacted.
        lines = [e for e in self.d.named("child.line") if e.get("engine") == "spare"]
        assert any(e["text"] == "api key: <redacted>" for e in lines), lines[:5]
        for key in {KEY, self.key}:
            leaked = [e for e in self.d.events if key in json.dumps(e)]
            assert not leaked and not [r for r in self.d.raw if key in r], leaked
        assert port_free(self.gate_port), "the gate's port is still taken"
        if sock:
            assert not os.path.exists(sock), "the spare's socket is left"


@pytest.fixture
def spared(tmp_path: Path) -> Iterator[Spared]:
    s = Spared(tmp_path)
    try:
        yield s
    finally:
        s.close()


def _fail_over(s: Spared, fault: str) -> None:
    s.start()
    pid0 = s.spare()["pid"]
    s.clients()
    s.more(10, "answers through the gate")
    since, t0 = s.d.mark(), time.time()
    if fault == "engine":
        os.kill(s.engine_pid(), signal.SIGKILL)
    elif fault == "api":
        os.kill(s.child_pid(), signal.SIGKILL)
    else:
        sigstop(s.engine_pid())
    served = s.d.wait_event("failover.served", WAIT, since)
    begin = s.d.named("restart.begin", since)[0]
    assert "spare wakes" in begin["failover"], begin
    s.more(10, "answers while the spare serves")
    s.d.wait_event("spare.rearmed", WAIT, since)
    s.d.wait_ready(WAIT, since)
    s.more(10, "answers from the full engine again")
    failed = s.end_clients()
    st = s.status()
    cut = [f for f in failed if f.startswith("stream cut")]
    if fault == "api":  # streams that had begun at the dead API server end cut, and only they
        # (at most one per streaming client: the one in flight at the kill). The fake streams
        # chunked as vLLM's uvicorn does, so the gate sees each cut and counts it.
        assert cut == failed and len(cut) <= STREAMS, (failed, st["gate"], s.d.dump())
        assert st["gate"]["cut_midstream"] >= len(cut), st["gate"]
    else:
        assert not failed, (failed, st["gate"], s.d.dump())
    assert st["serving"] == "full" and st["spare"]["state"] == "asleep", st["spare"]
    assert st["spare"]["pid"] == pid0, "the same spare, re-armed"
    print(f"{fault}: restart.begin {begin['ts'] - t0:.2f} s after the fault, the spare served "
          f"{served['ts'] - t0:.2f} s after it; {len(s.outcomes)} requests, {len(cut)} streams "
          "cut, no other failure")


@pytest.mark.parametrize("fault", ["engine", "api", "hang"])
def test_a_dead_or_hung_engine_fails_over_to_the_spare_and_no_request_fails(
        spared: Spared, fault: str) -> None:
    _fail_over(spared, fault)


def test_a_dead_spare_is_noticed_at_once_and_rebuilt(spared: Spared) -> None:
    spared.start()
    pid0 = spared.spare()["pid"]
    since, t0 = spared.d.mark(), time.time()
    os.killpg(pid0, signal.SIGKILL)
    died = spared.d.wait_event("spare.died", WAIT, since)
    spared.d.wait_event("spare.ready", WAIT, since)
    wait_for(lambda: spared.spare().get("state") == "asleep", WAIT, "the new spare asleep")
    assert spared.spare()["pid"] != pid0
    # each event names its build (the journal pairs them): the first died, the second serves
    assert died["build"] == 1 and spared.spare()["build"] == 2
    assert [e["build"] for e in spared.d.named("spare.ready", since)] == [2]
    assert [e["build"] for e in spared.d.named("spare.stopped", since)][:1] == [1]
    print(f"spare.died {died['ts'] - t0:.3f} s after the kill")


def _argv(pid: int) -> list[str]:
    return psutil.Process(pid).cmdline()


def test_a_reload_that_changes_the_command_rebuilds_the_spare_from_it(spared: Spared) -> None:
    """SIGHUP with new vllm.args and a rotated key (a new file): the serving engine restarts
    with them, the spare of the old command is stopped and rebuilt from the new one at the
    new engine's READY (its canary passes with the new key), and it still fails over."""
    spared.start()
    pid0, child0 = spared.spare()["pid"], spared.child_pid()
    assert "--max-num-seqs" not in _argv(pid0)
    tmp0 = psutil.Process(pid0).environ()["TMPDIR"]  # its own, not the serving child's
    assert os.path.isdir(tmp0) and tmp0 != psutil.Process(child0).environ().get("TMPDIR")
    rotated = "sk-SpareKeyRotated98765"
    (spared.tmp / "key2").write_text(rotated + "\n")
    (spared.tmp / "key2").chmod(0o600)
    since = spared.d.mark()
    spared.d.write_config(merge(spared.cfg, {"vllm": {
        "args": {"max-model-len": 4096, "max-num-seqs": 8},
        "api_key_file": str(spared.tmp / "key2")}}))
    spared.d.signal(signal.SIGHUP)
    rebuilt = spared.d.wait_event("spare.rebuilt", WAIT, since)
    assert rebuilt["why"] == "config reloaded: the vLLM command changed", rebuilt
    spared.d.wait_event("spare.ready", WAIT, since)
    wait_for(lambda: spared.spare().get("state") == "asleep", WAIT, "the rebuilt spare asleep")
    pid1, child1 = spared.spare()["pid"], spared.child_pid()
    assert pid1 != pid0 and child1 != child0
    assert dead(pid0)
    assert not os.path.exists(tmp0), "the stopped spare's TMPDIR is left"
    for pid in (pid1, child1):  # both run the new command
        argv = _argv(pid)
        assert argv[argv.index("--max-num-seqs") + 1] == "8", argv
    spared.key = rotated  # the clients send the new key; the spare's canary passed with it
    spared.clients()
    spared.more(6, "answers with the rotated key")
    since = spared.d.mark()
    os.kill(spared.engine_pid(), signal.SIGKILL)
    spared.d.wait_event("failover.served", WAIT, since)
    spared.more(6, "answers while the rebuilt spare serves")
    spared.d.wait_event("spare.rearmed", WAIT, since)
    failed = spared.end_clients()
    assert not failed, (failed, spared.d.dump())


def test_a_key_file_rewritten_in_place_rebuilds_the_spare_and_relaunches_with_it(
        spared: Spared) -> None:
    """SIGHUP after the key file was rewritten in place (same path, same config): the asleep
    spare of the old key is stopped, the serving engine relaunches with the new key and the
    spare is rebuilt with it at its READY; clients with the new key keep their answers
    through a failover (before this, the spare kept the old key: 401 at the failover)."""
    spared.start()
    pid0, child0 = spared.spare()["pid"], spared.child_pid()
    assert psutil.Process(pid0).environ()["VLLM_API_KEY"] == KEY
    rotated = "sk-SpareKeyInPlace24680"
    (spared.tmp / "key").write_text(rotated + "\n")  # same path, new key
    since = spared.d.mark()
    spared.d.signal(signal.SIGHUP)
    rebuilt = spared.d.wait_event("spare.rebuilt", WAIT, since)
    assert rebuilt["why"] == "config reloaded: the API key changed", rebuilt
    begin = spared.d.wait_event("restart.begin", WAIT, since)
    assert begin["failover"] == "none: the spare is down", begin
    spared.d.wait_event("spare.ready", WAIT, since)
    wait_for(lambda: spared.spare().get("state") == "asleep", WAIT, "the rebuilt spare asleep")
    pid1, child1 = spared.spare()["pid"], spared.child_pid()
    assert pid1 != pid0 and child1 != child0
    for pid in (pid1, child1):  # both answer the new key
        assert psutil.Process(pid).environ()["VLLM_API_KEY"] == rotated
    spared.key = rotated
    spared.clients()
    spared.more(6, "answers with the rotated key")
    since = spared.d.mark()
    os.kill(spared.engine_pid(), signal.SIGKILL)
    spared.d.wait_event("failover.served", WAIT, since)
    spared.more(6, "answers while the rebuilt spare serves")
    spared.d.wait_event("spare.rearmed", WAIT, since)
    failed = spared.end_clients()
    assert not failed, (failed, spared.d.dump())


def test_a_spare_turned_on_by_a_reload_waits_for_a_restart_and_says_so(tmp_path: Path) -> None:
    """Started with spare.enabled = false, a SIGHUP that turns it on is refused as a restart
    key (the plan measures the GPU while it is ours alone, before the serving engine): the
    serving engine keeps serving, no spare is planned or built, and config.restart_required
    and /status name the key until vllmwatch restarts."""
    s = Spared(tmp_path)
    off = merge(s.cfg, {"spare": {"enabled": "false"}})
    s.d.write_config(off)
    try:
        s.d.start()
        s.d.wait_ready(WAIT)
        assert s.status().get("spare") is None
        child0, since = s.child_pid(), s.d.mark()
        s.d.write_config(s.cfg)  # spare.enabled = "true"
        s.d.signal(signal.SIGHUP)
        needed = s.d.wait_event("config.restart_required", WAIT, since)
        assert needed["keys"] == ["spare.enabled"] and "restarts" in needed["detail"], needed
        wait_for(lambda: s.status().get("restart_required") == ["spare.enabled"], WAIT,
                 "restart_required in /status")
        reloaded = s.d.named("config.reloaded", since)
        assert reloaded and reloaded[0]["restart_needed"] is False, reloaded
        assert not s.d.named("spare.plan", since) and not s.d.named("spare.state", since)
        assert s.child_pid() == child0 and s.status().get("spare") is None
    finally:
        s.d.close()


def test_a_killed_daemons_spare_is_swept_socket_and_all(tmp_path: Path) -> None:
    """vllmwatch SIGKILLed (the OOM killer) with its spare asleep; the next start, with the
    spare turned off, swept the spare's processes but left its Unix socket file, for good:
    nothing of vLLM unlinks it. Review of 2026-12-05."""
    s = Spared(tmp_path)
    d2: Daemon | None = None
    try:
        s.start()
        sock = next(e["uds"] for e in s.d.named("spare.plan") if e.get("uds"))
        assert os.path.exists(sock)
        assert s.d.proc is not None
        s.d.proc.send_signal(signal.SIGKILL)
        s.d.proc.wait(10 * TIMEOUT_SCALE)
        argv = run_argv(tmp_path / "vllmwatch.toml", (PYTHON, "-m", "vllmwatch.testing.gpu_run",
                                                      s.ledger))
        d2 = Daemon(tmp_path, merge(s.cfg, {"spare": {"enabled": "false"}}), argv=argv,
                    own_session=True)
        d2.start()
        swept = d2.wait_event("spare.leftovers", WAIT)
        assert swept["killed"] and not swept["remaining"], swept
        removed = d2.wait_event("spare.socket_removed", WAIT)
        assert removed["path"] == sock and not os.path.exists(sock)
        d2.wait_ready(WAIT)
    finally:
        if d2 is not None:
            d2.close()
        s.d.close()


def test_a_spare_that_hangs_while_serving_is_routed_away_and_rebuilt(tmp_path: Path) -> None:
    """Nothing watched the spare while it served: one whose engine hung (SIGSTOP) took every
    request for as long as the relaunch took, unseen, and status said it served. Its canary
    and counters are checked now: called hung, routed away, stopped and rebuilt at the
    relaunch's READY, nothing left behind. Review of 2026-12-05."""
    s = Spared(tmp_path)
    go = tmp_path / "go"
    go.write_text("")
    s.d.config["vllm"]["command"] = [*s.d.config["vllm"]["command"], "--hold-start-until",
                                     str(go)]
    s.d.config["probe"] = {**s.d.config.get("probe", {}), "canary_timeout": "2s",
                           "canary_timeout_min": "1s", "failure_threshold": 2}
    s.d.write_config(s.d.config)
    stopped: list[int] = []
    try:
        s.start()
        spare_pid = s.spare()["pid"]
        go.unlink()  # the relaunch waits: a slow relaunch, the spare serving meanwhile
        since = s.d.mark()
        os.kill(s.engine_pid(), signal.SIGKILL)
        s.d.wait_event("failover.served", WAIT, since)
        [engine] = [p.pid for p in psutil.Process(spare_pid).children(recursive=True)
                    if "engine" in p.cmdline()]
        sigstop(engine)
        stopped.append(engine)
        hung = s.d.wait_event("spare.hung_serving", 2 * WAIT, since)
        assert "canaries in a row" in hung["detail"], hung
        wait_for(lambda: s.status().get("serving") != "spare", WAIT, "status routed away")
        wait_for(lambda: dead(spare_pid) and dead(engine), WAIT, "the hung spare stopped")
        go.write_text("")  # the relaunch reaches READY: the spare is rebuilt beside it
        s.d.wait_ready(WAIT, since)
        wait_for(lambda: s.spare().get("state") == "asleep", 2 * WAIT, "a new spare asleep")
        assert s.spare()["pid"] != spare_pid
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        go.write_text("")
        s.close()
