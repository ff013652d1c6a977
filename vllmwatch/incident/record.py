"""Build and write one incident record within its deadline (runs in a worker thread).

The shell hands over what it knows (Inputs: output, scrapes, /status, NVML's view); this
module reads the live tree (its processes, their memory, their stacks), redacts, writes the
record whole and prunes old ones. It never raises for a problem of the box: the result
says what went wrong, and the restart goes on regardless.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from vllmwatch.config.redact import REDACT, Redactor
from vllmwatch.incident import cause, dumpers, metrics, store

FORMAT = 1
_WRITE_RESERVE_S = 0.3  # of the deadline, kept for writing the files


@dataclass(frozen=True)
class Inputs:
    """What the shell knows when the record is asked for (read in the worker thread)."""

    seq: int
    reason: str
    detail: str
    exit_code: int | None
    timeout: float
    pgid: int | None
    child_pid: int | None  # the API server when it still runs; None once it exited
    facts: Mapping[str, Any]
    output: Sequence[str] = ()
    scrapes: Sequence[tuple[float, str]] = ()  # (wall time, /metrics text), oldest first
    status: Mapping[str, Any] = field(default_factory=dict)
    versions: Mapping[str, Any] = field(default_factory=dict)
    secrets: Sequence[str] = ()
    stacks_dir: str | None = None
    gpu: Callable[[], dict[str, Any]] | None = None  # NVML's view, read now
    max_records: int = 50
    max_bytes: int = 200 << 20
    cgroup: str | None = None  # the unit's cgroup: its memory.events counts OOM kills
    oom_at_launch: Mapping[str, int] | None = None  # ... as read when the child started
    gate: Mapping[str, int] | None = None  # the gate's figures of this engine (Gate.figures)


@dataclass(frozen=True)
class Written:
    """What came of it: the id, or the error; which stack methods ran."""

    incident_id: str = ""
    path: str = ""
    error: str = ""
    seconds: float = 0.0
    stacks: str = ""
    pruned: tuple[str, ...] = ()


def capture(inp: Inputs, root: str, wall: float | None = None) -> Written:
    """Read the tree, build the record, write it under root; bounded by inp.timeout."""
    t0 = time.monotonic()
    wall = time.time() if wall is None else wall
    rid = store.reserve(root, store.record_id(wall, inp.reason))  # its place: now
    try:  # (what raises is a record not written: its line in ORDER goes with the reservation)
        return _capture(inp, root, wall, rid, t0)
    finally:
        store.release(rid, root)


def _capture(inp: Inputs, root: str, wall: float, rid: str, t0: float) -> Written:
    deadline = t0 + max(0.2, inp.timeout - _WRITE_RESERVE_S)
    # a third of the time for /proc: the stacks and NVML have the rest
    procs, skipped = tree(inp.pgid, t0 + (deadline - t0) / 3)
    stacks, methods = _stacks(procs, inp.stacks_dir, deadline)
    red = Redactor(inp.secrets)
    record = build(inp, rid, wall, procs, stacks, methods, red, deadline)
    if skipped:  # (said with the tree: its list and stacks lack these processes)
        record["tree"]["skipped"] = skipped
        record["tree"]["note"] += f"; {len(skipped)} left out: /proc did not answer"
    record["capture"] = {"seconds": round(time.monotonic() - t0, 3), "timeout_s": inp.timeout}
    final = store.write(root, rid, lambda name: files_of({**record, "id": name}, stacks, red))
    try:  # (the record is written: a prune that failed does not make it a failed write)
        pruned = store.prune(root, inp.max_records, inp.max_bytes, keep=final)
    except OSError:
        pruned = []
    summary = ", ".join(f"{k}: {v}" for k, v in methods.items())
    return Written(final, os.path.join(root, final), seconds=time.monotonic() - t0,
                   stacks=summary, pruned=tuple(pruned))


StackDumps = list[tuple[int, list[dumpers.Dump]]]


def files_of(record: Mapping[str, Any], stacks: StackDumps, red: Redactor) -> dict[str, str]:
    """The files of one record, every one through the redactor: one pass over the whole
    record (thread names, frames, titles, /status, versions) that report.txt and output.log
    are then made from, and the raw stack dumps."""
    from vllmwatch.incident import report  # (only when a record is written: the daemon's

    clean = red.deep(dict(record))  # import count, tests/daemon/test_import_count.py)
    files = {store.RECORD: store.dumps(clean),
             "report.txt": report.render(clean),
             "output.log": "\n".join(str(line) for line in clean.get("output") or []) + "\n"}
    for pid, dumps in stacks:
        for d in dumps:
            if d.raw:
                files[f"stacks-{pid}-{d.method}.txt"] = red.text(d.raw)
    return files


def _stacks(procs: Sequence[Proc], stacks_dir: str | None, deadline: float
            ) -> tuple[StackDumps, dict[str, str]]:
    """Both methods at once over every live process; what ran and why not."""
    pids = [p.pid for p in procs if p.state not in ("Z", "")]
    exe = dumpers.find_pyspy()
    methods: dict[str, str] = {}
    if not pids:
        return [], {"py-spy": "not run: no live process", "faulthandler": "not run: no live "
                    "process"}
    with ThreadPoolExecutor(max_workers=min(16, len(pids) + 1),
                            thread_name_prefix="vllmwatch-incident") as pool:
        spy = {pid: pool.submit(dumpers.pyspy_dump, exe, pid, deadline) for pid in pids} \
            if exe else {}
        fh = dumpers.faulthandler_dumps(pids, stacks_dir, deadline)
        spied = {pid: f.result() for pid, f in spy.items()}
    out: StackDumps = []
    for pid in pids:
        got = [d for d in (spied.get(pid), fh.get(pid)) if d is not None]
        out.append((pid, got))
    methods["py-spy"] = _verdict([d for _, ds in out for d in ds if d.method == "py-spy"],
                                 "not installed (pip install 'vllmwatch[incidents]')"
                                 if exe is None else "")
    methods["faulthandler"] = _verdict([d for _, ds in out for d in ds
                                        if d.method == "faulthandler"], "")
    return out, methods


def _verdict(dumps: Sequence[dumpers.Dump], missing: str) -> str:
    if missing:
        return f"not run: {missing}"
    ok = sum(d.ok for d in dumps)
    if ok == len(dumps):
        return f"ran for all {ok} processes"
    errors = sorted({d.error for d in dumps if not d.ok})
    return f"ran for {ok} of {len(dumps)} processes; " + "; ".join(errors[:3])


def build(inp: Inputs, rid: str, wall: float, procs: Sequence[Proc],
          stacks: StackDumps, methods: Mapping[str, str], red: Redactor,
          deadline: float | None = None) -> dict[str, Any]:
    """The record as JSON-ready data (sections in the order the report shows them); NVML
    is waited for until `deadline` (monotonic; None: a moment)."""
    by_pid = {p.pid: p for p in procs}
    gpu = _gpu(inp.gpu, time.monotonic() if deadline is None else deadline)
    child_alive = inp.child_pid in by_pid and by_pid[inp.child_pid].state != "Z" \
        if inp.child_pid is not None else False
    facts = dict(inp.facts)
    record = {
        "format": FORMAT, "id": rid, "reason": inp.reason, "detail": red.text(inp.detail),
        "exit_code": inp.exit_code,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall)), "time": wall,
        "timeline": cause.timeline(facts),
        "tree": {"api_server_alive": child_alive, "alive": bool(procs),
                 "note": _tree_note(inp, child_alive, procs),
                 "processes": [red.deep(asdict(p)) for p in procs],
                 "host_rss_mib": round(sum(p.rss_mib for p in procs), 1)},
        "stacks": {"methods": dict(methods),
                   "processes": [{"pid": pid, "role": by_pid[pid].role if pid in by_pid
                                  else "?", "dumps": [_dump_json(d, red) for d in ds]}
                                 for pid, ds in stacks]},
        "metrics": metrics.section(inp.scrapes, wall),
        "memory": {"last_sample": facts.pop("last_sample", None),
                   "samples": facts.pop("memory_samples", None),
                   "gpu_now": gpu},
        "output": red.lines(inp.output),
        "status": red.deep(dict(inp.status)),
        "core": red.deep(facts),
        "versions": {**inp.versions, **({"driver": gpu["driver"]} if gpu.get("driver")
                                        else {})},  # (NVML's, read with the rest of it)
        "config_sha256": facts.get("config_sha256", ""),
        "oom": cause.oom_section(inp.cgroup, inp.oom_at_launch, cause.oom_counts(inp.cgroup)),
        "gate": dict(inp.gate) if inp.gate is not None else None,
    }
    record["cause"] = cause.lines(record)
    return record


def _tree_note(inp: Inputs, child_alive: bool, procs: Sequence[Proc]) -> str:
    if not procs:
        return "the vLLM tree was already gone when the record was taken"
    if not child_alive:
        roles = ", ".join(sorted({p.role for p in procs}))
        return f"the API server had already exited; still running in its group: {roles}"
    return "the vLLM tree was alive when the record was taken (before vllmwatch stopped it)"


def _dump_json(d: dumpers.Dump, red: Redactor) -> dict[str, Any]:
    return {"method": d.method, "ok": d.ok, "error": d.error, "seconds": round(d.seconds, 3),
            "threads": [{"name": t.name, "current": t.current, "blocked": t.blocked,
                         "frames": [[f.function, f.file, f.line] for f in t.frames]}
                        for t in d.threads] if d.ok else []} | \
        ({} if d.ok else {"output": red.tail(d.raw, 2000)})


# NVML's read of an earlier record that never answered. A wedged driver (a GPU off the bus)
# blocks NVML's calls for good: the record waited with it, never came, and each restart
# left one more of the loop's I/O workers blocked. While it is stuck no other is started.
_NVML_STUCK: list[threading.Thread] = []
_WEDGED = "(a wedged driver? see nvidia-smi and the kernel log for Xid)"


def _gpu(read: Callable[[], dict[str, Any]] | None, deadline: float) -> dict[str, Any]:
    """NVML's view, read on a thread of its own and waited for until `deadline` (at least
    0.2 s); what went wrong instead, as the section's `error`."""
    if read is None:
        return {}
    if any(t.is_alive() for t in _NVML_STUCK):
        return {"error": f"not read: NVML has not answered since an earlier record {_WEDGED}"}
    box: list[dict[str, Any]] = []

    def run() -> None:
        try:
            box.append(read())
        except Exception as exc:  # NVML can fail in many ways; the record goes on without it
            box.append({"error": f"{type(exc).__name__}: {exc}"})

    worker = threading.Thread(target=run, name="vllmwatch-incident-nvml", daemon=True)
    worker.start()
    wait = max(0.2, deadline - time.monotonic())
    worker.join(wait)
    if worker.is_alive() or not box:
        _NVML_STUCK[:] = [worker]
        return {"error": f"not read: NVML did not answer within {wait:.1f}s {_WEDGED}"}
    return box[0]


# --- the processes of the child's tree as a record shows them: pid, role, state, memory ----
# vLLM never leaves the session we start it in (setsid) and keeps the API server's process
# group, so the group (or session) finds every process, even ones orphaned by an API server
# that was killed.

_MIB = 1024 * 1024


@dataclass(frozen=True)
class Proc:
    """One live process of the tree."""

    pid: int
    ppid: int
    role: str  # api_server | engine_core | worker | other
    title: str  # the process title / command line (redacted by the record)
    state: str  # R S D T t Z (from /proc)
    rss_mib: float
    threads: int


def role_of(title: str, is_leader: bool) -> str:
    """What a vLLM process is, from its title (VLLM::EngineCore, VLLM::Worker_TP0, ...)."""
    if "EngineCore" in title:
        return "engine_core"
    if "VLLM::Worker" in title or "VllmWorker" in title:
        return "worker"
    if "APIServer" in title or is_leader:
        return "api_server"
    return "other"


def processes_now() -> Iterator[psutil.Process]:
    """Every process as it is now: a fresh psutil.Process per pid. psutil >= 6's
    process_iter() hands back the objects of its last call without checking that a pid was
    not reused meanwhile: such an object reads the new process (cmdline, environ) while its
    kill() and ppid() refuse it ("PID has been reused"). A sweep then found a leftover of
    ours and left it running (the refusal suppressed), and a record dropped a live process."""
    for pid in psutil.pids():
        try:
            yield psutil.Process(pid)
        except psutil.Error:
            continue


def processes(pgid: int | None) -> list[Proc]:
    """The live processes in the child's group or session, leader first."""
    return tree(pgid, time.monotonic() + 3600)[0]


# Reads of /proc that never answered. A process in D state (a driver call that hangs) holds
# its memory map's lock, and a read of its /proc/PID/cmdline waits for that lock for good:
# the record's thread stayed blocked and the next record queued behind it. Each process is
# read on a thread of its own until the deadline; one still stuck is not read again.
_PROC_STUCK: dict[int, threading.Thread] = {}


def tree(pgid: int | None, deadline: float) -> tuple[list[Proc], list[str]]:
    """The live processes in the child's group or session, leader first, each read within
    `deadline` (monotonic); a line for each process left out."""
    if pgid is None:
        return [], []
    out: list[Proc] = []
    skipped: list[str] = []
    readers: dict[int, threading.Thread] = {}
    for proc in processes_now():
        try:  # (getpgid and getsid are syscalls that do not wait for the process)
            if os.getpgid(proc.pid) != pgid and os.getsid(proc.pid) != pgid:
                continue
        except OSError:
            continue
        stuck = _PROC_STUCK.get(proc.pid)
        if stuck is not None and stuck.is_alive():
            skipped.append(f"pid {proc.pid}: not read: its /proc files have not answered "
                           f"since an earlier record {_D_STATE}")
            continue
        readers[proc.pid] = threading.Thread(target=_read_one, args=(proc, pgid, out),
                                             name="vllmwatch-incident-proc", daemon=True)
        readers[proc.pid].start()
    late: set[int] = set()
    for pid, reader in readers.items():
        reader.join(max(0.0, deadline - time.monotonic()))
        if reader.is_alive():
            late.add(pid)
            _PROC_STUCK[pid] = reader
            skipped.append(f"pid {pid}: its /proc files did not answer in time {_D_STATE}")
    # (a copy: two captures can overlap, each in its worker thread, and change the dict)
    for pid in [p for p, t in list(_PROC_STUCK.items()) if not t.is_alive()]:
        _PROC_STUCK.pop(pid, None)
    # one said to be left out stays out, even if its read ended since: the note says so
    done = [p for p in list(out) if p.pid not in late]
    return sorted(done, key=lambda p: (p.pid != pgid, p.pid)), skipped


_D_STATE = "(a process in D state: a hung driver call? see the kernel log); left out"


def _read_one(proc: psutil.Process, pgid: int, out: list[Proc]) -> None:
    try:
        with proc.oneshot():
            title = " ".join(proc.cmdline()) or proc.name()
            state = dumpers.process_state(proc.pid)
            out.append(Proc(proc.pid, proc.ppid(), role_of(title, proc.pid == pgid),
                            REDACT.head(title, 400), state,
                            round(proc.memory_info().rss / _MIB, 1), proc.num_threads()))
    except (psutil.Error, OSError):
        return
