"""Issue 34: the sleeping spare engine behind the gate, 8B shape (docs/GPU.md section 14).

  spare   the gate on, `[spare] enabled = true` (`kv_cache` at its default), the standby and
          the start-up caches at their defaults, the shipped [probe]/[restart]/[drain] except
          the leak rule's size. At start: the plan (`spare.plan`: the serving engine's setting
          before -> after), the spare built and asleep (`spare.ready`, its awake and asleep
          MiB), then the serving engine. Then, while 16 clients load the gate and a prober
          sends one short completion every 50 ms through it, the faults in FAULTS order for as
          long as the call's budget lasts (each >= restart.stable_after after READY and after
          the spare is asleep again). Per fault one `failover` line: the journal's
          restart.begin, failover.begin/.served/.deferred/.failed, child.ready,
          failover.returned and spare.rearmed relative to the fault; the prober's first
          answer after the fault (and after restart.begin); who served (/status `serving`,
          sampled at 10 Hz); what the clients saw. Greedy token ids of the full engine and of
          the spare while it serves. After the stop: nothing of either tree left.
          SPARE_FAULTS (names from FAULTS, comma-separated) picks the faults;
          SPARE_ENABLED=false runs the same with the spare off, for the same host's relaunch
          and outage without it (`choice`).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.gpu import loadgen as LG
from bench.gpu.calls import greedy_ids, http
from bench.gpu.config import big_config
from bench.gpu.daemon import GpuDaemon
from bench.gpu.inject import leak_env, serving
from bench.gpu.models import ensure_big
from bench.gpu.phases.standby import stable_after
from bench.gpu.procs import find_titled, vllm_like
from bench.gpu.run import Run

FAULTS = ("engine_kill9", "hang", "api_server_sigkill", "sigusr1", "engine_kill9", "hang",
          "gpu_leak", "engine_kill9", "hang")
# The dry run (fake vLLM, shipped probes): the faults its tree recovers from in seconds.
DRY_FAULTS = ("engine_kill9", "api_server_sigkill", "sigusr1")
EVENTS = ("restart.begin", "failover.begin", "failover.deferred", "failover.failed",
          "failover.served", "gpu.released", "child.started", "child.ready",
          "failover.returned", "spare.rearmed")
PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time")
KNOWN = frozenset(FAULTS)


def choice(env: dict[str, str]) -> tuple[tuple[str, ...] | None, bool]:
    """What a call asks of the phase beyond its defaults: SPARE_FAULTS (comma-separated names
    from FAULTS, in order) and SPARE_ENABLED=false (the same run without the spare: the
    relaunch and the gate's hold measured on the same host, docs/GPU.md section 15)."""
    raw = env.get("SPARE_FAULTS", "").strip()
    faults = tuple(f.strip() for f in raw.split(",") if f.strip()) if raw else None
    bad = sorted(set(faults or ()) - KNOWN)
    if bad:
        raise SystemExit(f"SPARE_FAULTS: unknown {bad}; known: {sorted(KNOWN)}")
    on = env.get("SPARE_ENABLED", "true").strip().lower()
    if on not in ("true", "false"):
        raise SystemExit(f"SPARE_ENABLED={on!r}: true or false")
    return faults, on == "true"


def spare(run: Run) -> None:
    faults, enabled = choice(dict(os.environ))
    ensure_big(run)
    trigger = run.work / "spare.trigger"
    trigger.unlink(missing_ok=True)
    port, status_port, gate_port = run.port(30), run.status_port(30), run.port(31)
    conf = big_config(run, "spare", port, status_port, run.work / "cache8b-caches",
                      env=leak_env(trigger), memory={"gpu_growth_limit": "4GiB"},
                      shipped_probe=True, shipped_drain=True,
                      restart={"stable_after": f"{stable_after(run):.0f}s"},
                      tables={"gate": {"enabled": True, "listen": f"127.0.0.1:{gate_port}"},
                              "spare": {"enabled": enabled}})
    run.emit("spare", "start", gpu=run.wait_idle_gpu(), gate_port=gate_port,
             spare_enabled=enabled, faults=faults or FAULTS)
    d = GpuDaemon(run, "spare", conf, "spare-vllmwatch.log")
    try:
        if not serving(d, "ready", gate_port, "q8b", timeout=600):
            run.emit("spare", "start_events", events=_events(d, 0, 0.0, (
                "spare.plan", "spare.ready", "spare.failed", "spare.off", "failover.failed",
                "child.exited", "daemon.exit")))
            return
        run.emit("spare", "started", plan=d.named("spare.plan")[-1:],
                 ready=d.named("spare.ready")[:1], status=_spare_status(status_port),
                 nvml=run.nv.snapshot())
        full_ids = [greedy_ids(gate_port, "q8b", p, 24) for p in PROMPTS]
        spare_ids: list[dict[str, Any]] = []
        for i, what in enumerate(DRY_FAULTS if run.dry else faults or FAULTS):
            if run.left() < 100:
                run.emit("spare", "skipped", fault=what, i=i, left_s=round(run.left()))
                continue
            _quiet(d, status_port)
            got = _one(d, what, i, port, gate_port, status_port, trigger,
                       want_ids=not spare_ids)
            spare_ids = spare_ids or got
        run.emit("spare", "greedy_equal", full=[r.get("ids") for r in full_ids],
                 spare=[r.get("ids") for r in spare_ids],
                 equal=bool(spare_ids) and all(
                     a.get("ids") and a.get("ids") == b.get("ids")
                     for a, b in zip(full_ids, spare_ids, strict=True)))
        d.memory_view()
        run.emit("spare", "status_at_end", status=_spare_status(status_port))
    finally:
        trigger.unlink(missing_ok=True)
        d.stop_and_check()
        run.emit("spare", "spare_left", processes=[p for p in vllm_like()
                                                   if "spare" in json.dumps(p)],
                 sockets=[str(p) for p in Path(run.work).rglob("spare-*.sock")],
                 nvml=run.nv.snapshot())


def _quiet(d: GpuDaemon, status_port: int) -> None:
    """Wait (bounded) until READY for > stable_after and the spare is asleep again (or off:
    the dry run's fake NVML is not the daemon's, so its plan is off there)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < min(150.0, max(10.0, d.run.left() - 60)):
        st = _spare_status(status_port)
        ready = d.named("child.ready")
        ready_for = time.monotonic() - d.t0 - ready[-1]["t"] if ready else 0.0
        if (st.get("ready") and st.get("spare_state") in ("asleep", "off", None)
                and ready_for > stable_after(d.run) + 1):
            return
        d.run.pause(0.5)


def _one(d: GpuDaemon, what: str, i: int, port: int, gate_port: int, status_port: int,
         trigger: Path, want_ids: bool) -> list[dict[str, Any]]:
    run = d.run
    load = LG.Load([gate_port], "q8b", 16, max_tokens=64).start()
    ids: list[dict[str, Any]] = []
    with _prober(gate_port) as answers, _serving_trace(status_port) as who:
        run.pause(5)
        mark, t_fault = d.count(), d.now()
        t_mono = time.monotonic()
        act = _fault(d, what, trigger)
        if act is None:
            run.emit("spare", "failover", fault=what, i=i, error="target not found")
            load.stop()
            return ids
        act()
        if want_ids:  # the spare's greedy ids while it serves (bounded wait for it)
            t = time.monotonic()
            while time.monotonic() - t < 60 and not d.named("failover.served", mark) \
                    and not d.named("child.ready", mark):
                run.pause(0.1)
            if d.named("failover.served", mark) and not d.named("failover.returned", mark):
                ids = [greedy_ids(gate_port, "q8b", p, 24) for p in PROMPTS]
        found = d.ready(mark, timeout=min(300.0, max(30.0, run.left() - 30)))
        t = time.monotonic()
        while time.monotonic() - t < 60 and d.named("failover.served", mark) \
                and not d.named("spare.rearmed", mark):
            run.pause(0.25)
        run.pause(2)
    recs = load.stop()
    begin = d.named("restart.begin", mark)
    t_begin = begin[0]["t"] if begin else None
    first_after = next((a for a in answers if a[0] >= t_mono and a[1] == 200), None)
    first_after_begin = (next((a for a in answers if a[1] == 200
                               and a[0] - t_mono >= t_begin - t_fault), None)
                         if t_begin is not None else None)
    run.emit("spare", "failover", fault=what, i=i, ready_again=found[0] >= 0,
             events=_events(d, mark, t_fault, EVENTS),
             begin_after_fault_s=round(t_begin - t_fault, 2) if t_begin is not None else None,
             first_answer_after_fault_s=round(first_after[0] - t_mono, 3)
             if first_after else None,
             first_answer_after_begin_s=round(first_after_begin[0] - t_mono
                                              - (t_begin - t_fault), 3)
             if first_after_begin and t_begin is not None else None,
             prober_failed=sum(1 for a in answers if a[0] >= t_mono and a[1] != 200),
             prober_errors=sorted({str(a[2]) for a in answers
                                   if a[0] >= t_mono and a[1] != 200})[:4],
             serving=who, clients=LG.outage(recs, t_mono, time.monotonic()),
             restart=[{k: e.get(k) for k in ("reason", "failover", "failures_in_row")}
                      for e in begin[:1]],
             ready=[{k: e.get(k) for k in ("startup_s", "launch", "reuse")}
                    for e in d.named("child.ready", mark)[:1]])
    if want_ids:
        run.emit("spare", "spare_greedy", ids=[r.get("ids") for r in ids],
                 status=[r.get("status") for r in ids])
    return ids


def _fault(d: GpuDaemon, what: str, trigger: Path) -> Callable[[], object] | None:
    if what == "sigusr1":
        return lambda: d.send(signal.SIGUSR1)
    if what == "gpu_leak":
        return lambda: trigger.write_text("go")
    if what == "api_server_sigkill":
        started = d.named("child.started")
        target = int(started[-1]["pid"]) if started else None
        sig = signal.SIGKILL
    else:
        target = find_titled("VLLM::EngineCore", d.pid)
        sig = signal.SIGSTOP if what == "hang" else signal.SIGKILL
    if target is None:
        return None
    pid = target
    return lambda: os.kill(pid, sig)


def _events(d: GpuDaemon, mark: int, t_fault: float, names: tuple[str, ...]
            ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        evs = d.named(name, mark)
        if evs:
            e = evs[0]
            out[name] = {"after_s": round(e["t"] - t_fault, 3),
                         **{k: v for k, v in e.items()
                            if k not in ("t", "level", "event", "pid") and len(str(v)) < 300}}
    return out


def _spare_status(status_port: int) -> dict[str, Any]:
    code, body = http("GET", f"http://127.0.0.1:{status_port}/status", timeout=2)
    if code != 200:
        return {}
    st = json.loads(body)
    sp = st.get("spare") if isinstance(st.get("spare"), dict) else {}
    return {"ready": st.get("ready"), "serving": st.get("serving"),
            "spare_state": sp.get("state"), "spare": sp,
            "gpu_tree_mib": st.get("memory", {}).get("gpu_tree_mib")}


@contextmanager
def _background(step: Callable[[], None], every: float, join: float) -> Iterator[None]:
    """step() on a thread of its own every `every` s while inside; joined on the way out."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            step()
            stop.wait(every)

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join(join)


@contextmanager
def _prober(gate_port: int) -> Iterator[list[tuple[float, int | None, str]]]:
    """One 4-token completion through the gate every 50 ms: (monotonic end, status, error)."""
    out: list[tuple[float, int | None, str]] = []

    def ask() -> None:
        code, body = http("POST", f"http://127.0.0.1:{gate_port}/v1/completions",
                          {"model": "q8b", "prompt": "Hi", "max_tokens": 4}, 30)
        out.append((time.monotonic(), code, "" if code == 200 else body[:120]))

    with _background(ask, 0.05, 35):
        yield out


@contextmanager
def _serving_trace(status_port: int) -> Iterator[list[tuple[float, Any, Any]]]:
    """/status `serving` and the spare's state at 10 Hz: each change, relative to entry."""
    out: list[tuple[float, Any, Any]] = []
    t0 = time.monotonic()
    last: list[tuple[Any, Any]] = [(None, None)]

    def look() -> None:
        st = _spare_status(status_port)
        now = (st.get("serving"), st.get("spare_state"))
        if now != last[0]:
            out.append((round(time.monotonic() - t0, 2), *now))
            last[0] = now

    with _background(look, 0.1, 5):
        yield out
