"""An incident report read cold names its cause in its first five lines (issue 36.15-19).

Records are built the way record.build builds them (cause lines, OOM counts from a
memory.events file, canary verdicts in the timeline), then rendered.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.secrets import known_key
from vllmwatch.incident import cause, dumpers, metrics, report

ENGINE = "VLLM::EngineCore"


def _record(**extra: Any) -> dict[str, Any]:
    r: dict[str, Any] = {"id": "20261202T060000Z-x", "time_utc": "2026-12-02T06:00:00Z",
                         "tree": {"note": "alive", "processes": []},
                         "stacks": {"methods": {}, "processes": []}, "output": []}
    r.update(extra)
    r["cause"] = cause.lines(r)
    return r


def _head(r: dict[str, Any]) -> list[str]:
    return report.render(r).splitlines()[:5]


def test_memory_events_are_read_bounded_and_compared_with_the_launch(tmp_path: Path) -> None:
    unit = tmp_path / "system.slice" / "vllmwatch.service"
    unit.mkdir(parents=True)
    (unit / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (tmp_path / "cgroup").write_text("0::/system.slice/vllmwatch.service\n")
    group = cause.unit_cgroup(str(tmp_path / "cgroup"))
    assert group == "/system.slice/vllmwatch.service"
    assert cause.oom_counts(group, str(tmp_path)) == {"low": 0, "high": 0, "max": 3, "oom": 1,
                                                      "oom_kill": 1}
    assert cause.oom_counts("/nowhere", str(tmp_path)) is None
    assert cause.oom_counts(None) is None


def test_an_engine_sigkill_names_the_engine_the_signal_and_the_oom_evidence() -> None:
    detail = "engine process died: pid 812 (VLLM::EngineCore) killed by SIGKILL (the OOM " \
             "killer? see the incident record)"
    oom = cause.oom_section("/system.slice/vllmwatch.service", {"oom_kill": 0},
                            {"oom": 1, "oom_kill": 1})
    r = _record(reason="engine_died", detail=detail, oom=oom, output=[
        "(APIServer pid=800) ERROR 12-02 06:00:00 [core_client.py:1] Engine core proc "
        "EngineCore_DP0 died unexpectedly, shutting down client."])
    head = "\n".join(_head(r))
    assert "reason: engine_died: engine process died: pid 812 (VLLM::EngineCore) killed by " \
           "SIGKILL" in head, head
    assert "the OOM killer killed in this service" in head and "1 since the launch" in head
    assert "journalctl -k -g 'Killed process 812'" in head, head
    # no OOM kill counted: said so, and where else to look
    r = _record(reason="engine_died", detail=detail, oom=cause.oom_section(
        "/u", {"oom_kill": 2}, {"oom_kill": 2}))
    assert "no OOM kill counted here" in "\n".join(_head(r))
    # the unit's cgroup unreadable: still where to look
    r = _record(reason="engine_died", detail=detail, oom=cause.oom_section(None, None, None))
    assert "not readable" in "\n".join(_head(r)) and "journalctl -k" in "\n".join(_head(r))


def test_a_sigstop_hang_names_the_stopped_process_and_the_verdicts_in_the_timeline() -> None:
    facts = {"uptime_s": 100.0, "ready_for_s": 60.0, "canary_verdicts": [
        [-7.9, "canary timed out after 2s: nothing moved, retry with 4s"],
        [0.0, "canary timed out after 4s: hang"]]}
    r = _record(reason="hang", detail="canary timed out twice in a row (last after 4s) while "
                "/health said 200, and nothing the engine reports moved",
                tree={"note": "alive", "processes": [
                    {"pid": 800, "role": "api_server", "state": "S", "rss_mib": 900.0,
                     "threads": 9},
                    {"pid": 812, "role": "engine_core", "state": "T", "rss_mib": 2000.0,
                     "threads": 6}]},
                timeline=cause.timeline(facts))
    head = _head(r)
    assert head[2].startswith("reason: hang: canary timed out twice"), head
    assert "engine_core pid 812 is stopped (state T: SIGSTOP" in "\n".join(head), head
    text = report.render(r)
    assert "canary timed out after 2s: nothing moved, retry with 4s" in text
    assert text.index("retry with 4s") < text.index("incident: restart decided")


def test_deadlocked_threads_show_as_blocked_on_a_lock() -> None:
    frames = [["take", "/x/fake_engine.py", 271], ["engine_deadlock", "/x/fake_engine.py", 275]]
    r = _record(reason="hang", detail="frozen", stacks={"methods": {}, "processes": [{
        "pid": 812, "role": "engine_core", "dumps": [{"method": "py-spy", "ok": True, "threads": [
            {"name": "MainThread (idle)", "blocked": True, "frames": frames},
            {"name": "tqdm (idle)", "blocked": False,
             "frames": [["wait", "threading.py", 1]]}]}]}]})
    assert "threads blocked on a lock in take (/x/fake_engine.py:271)" in "\n".join(_head(r))
    text = report.render(r)
    assert "thread MainThread (blocked on a lock): in take" in text
    assert "thread tqdm (idle): in wait" in text


def test_py_spy_s_own_error_line_not_its_backtrace() -> None:
    stderr = ("Error: Failed to find a python interpreter in the .data section\n"
              "Stack backtrace:\n   0: anyhow::error::<impl anyhow::Error>::msg\n"
              "  10: py_spy::main\n  11: main\n   at src/main.rs:1\n")
    assert dumpers.error_line(stderr) == \
        "Error: Failed to find a python interpreter in the .data section"
    assert dumpers.error_line("Permission denied (os error 13)\n") == \
        "Permission denied (os error 13)"
    assert dumpers.error_line("  11: main\n") == ""


def test_the_first_error_block_comes_before_the_tail() -> None:
    out = ["(APIServer pid=1) INFO serving"] * 5 + [
        "(APIServer pid=1) ERROR 12-02 [async_llm.py:1] AsyncLLM output_handler failed.",
        "(APIServer pid=1) Traceback (most recent call last):",
        "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered "
        "an issue."] + [f"(APIServer pid=1) INFO shutdown noise {i}" for i in range(60)]
    warning = ("(APIServer pid=1) WARNING 12-02 [system_utils.py:255] Found ulimit of 20000 "
               "... This can cause fd limit errors like `OSError: [Errno 24] Too many open "
               "files`.")
    assert not cause.is_error(warning)  # a warning quoting an error is not one
    assert cause.is_error(out[7]) and cause.is_error(out[5])
    out = [warning, *out]
    text = report.render(_record(reason="engine_died", detail="x", output=out))
    first = text.index("== first error in the output (line 7 of 69) ==")
    assert first < text.index("EngineDeadError", first) < text.index(
        "== last output lines (40 of 69")
    # the cause line names the exception the traceback ends in, not its first line
    assert "cause: first error in vLLM's output: (APIServer pid=1) vllm.v1.engine.exceptions" \
        ".EngineDeadError" in text
    assert "shutdown noise 59" in text
    # the error within the tail: shown once, in the tail
    text = report.render(_record(reason="crash", detail="x", output=out[-40:] + out[6:9]))
    assert "== first error in the output" not in text  # the cause line, and the tail
    assert text.count("EngineDeadError") == 2


def _scrape(gen: float, prompt: float, running: float, ok: float) -> str:
    lab = 'engine="0",model_name="m"'
    return (f"vllm:num_requests_running{{{lab}}} {running}\n"
            f"vllm:num_requests_waiting{{{lab}}} 2.0\n"
            f"vllm:kv_cache_usage_perc{{{lab}}} 0.25\n"
            f"vllm:generation_tokens_total{{{lab}}} {gen}\n"
            f"vllm:prompt_tokens_total{{{lab}}} {prompt}\n"
            f'vllm:request_success_total{{{lab},finished_reason="length"}} {ok}\n'
            + "".join(f"vllm:e2e_request_latency_seconds_{k}{{{lab}}} {gen * i}\n"
                      for i, k in enumerate(("sum", "count"), 1)))


def test_the_metrics_summary_comes_before_the_full_list() -> None:
    scrapes = [(1000.0, _scrape(100, 50, 1, 10)), (1060.0, _scrape(700, 350, 3, 40)),
               (1120.0, _scrape(700, 350, 3, 40))]
    m = metrics.section(scrapes, 1125.0)
    s = m["summary"]
    assert (s["running"], s["waiting"], s["kv_cache_usage"]) == (3.0, 2.0, 0.25)
    assert s["generation_tokens_per_s"] == 5.0 and s["requests_finished_per_s"] == 0.25
    assert s["tokens_last_moved_s_ago"] == [65.0, 125.0]  # between these two scrapes
    text = report.render(_record(reason="hang", detail="x", metrics=m))
    summary = text.index("summary: 3 running, 2 waiting, KV cache 25% used")
    assert summary < text.index("generation tokens last moved between 65 and 125 s")
    assert text.index("5 generation tokens/s") < text.index("every series that moved")
    assert "vllm:e2e_request_latency_seconds_sum" in text  # the full list, below


def test_the_cause_lines_first_error_is_redacted_before_it_is_cut(monkeypatch: Any) -> None:
    """The cause quotes 200 characters of vLLM's first error line; the record is redacted
    after, too late for a part of a known secret across the cut: hidden whole first."""
    key = known_key(monkeypatch)
    line = "ERROR " + "e" * 185 + key + " Bearer t0kenB3arer9"
    said = cause.lines({"output": ["INFO fine", line]})
    assert said and said[-1].startswith("first error in vLLM's output: ERROR eee")
    assert key[:4] not in said[-1] and "<redacte" in said[-1]


def test_the_kv_cache_use_of_several_engines_is_the_fullest_never_a_sum() -> None:
    """Data parallel: one kv_cache_usage_perc per engine, each a fraction of its own cache.
    Two engines at 90 % are a KV cache 90 % used (the fullest), not 180 %; the request
    counts are still summed over the engines."""
    from vllmwatch.shell.probes import parse_metrics

    scrape = "".join(f'vllm:kv_cache_usage_perc{{engine="{e}",model_name="m"}} {kv}\n'
                     f'vllm:num_requests_running{{engine="{e}",model_name="m"}} {run}\n'
                     for e, kv, run in (("0", 0.9, 3.0), ("1", 0.4, 4.0)))
    m = metrics.section([(1000.0, scrape), (1060.0, scrape)], 1065.0)
    assert (m["summary"]["kv_cache_usage"], m["summary"]["running"]) == (0.9, 7.0)
    assert "summary: 7 running, - waiting, KV cache 90% used" in report.render(
        _record(reason="hang", detail="x", metrics=m))
    live = parse_metrics(scrape)
    assert live["vllm:kv_cache_usage_perc"] == 0.9 and live["vllm:num_requests_running"] == 7.0


@pytest.mark.parametrize("odd", [
    {"timeline": [[None, "x"], [3.5, "restart.begin"]]}, {"timeline": [{"t": 1}, "s"]},
    {"timeline": "s"}, {"cause": 7}, {"versions": ["vllm"]}, {"tree": "gone"},
    {"capture": 5}, {"gate": None, "core": [1]},
], ids=lambda odd: ",".join(f"{k}={type(v).__name__}" for k, v in odd.items()))
def test_an_odd_field_never_hides_why_the_restart_happened(odd: dict[str, Any]) -> None:
    """A record of an older version, or hand-edited: whatever shape a field of the head has,
    its first lines still say the reason and the detail; a timeline entry of a wrong shape
    costs only its own line."""
    r = _record(reason="engine_died", detail="pid 812 (VLLM::EngineCore) killed by SIGKILL")
    r.update(odd)
    lines = _head(r)
    assert lines[0] == "== reason and timeline ==", lines
    assert lines[2] == "reason: engine_died: pid 812 (VLLM::EngineCore) killed by SIGKILL"
    if isinstance(odd.get("timeline"), list) and [3.5, "restart.begin"] in odd["timeline"]:
        text = report.render(r)
        assert "       3.5  restart.begin" in text and "         ?  x" in text, text


def test_the_cause_is_where_the_last_burst_of_errors_began_not_an_old_error() -> None:
    """A server up for hours has a client's 400 (logged at ERROR, with a traceback) high in
    the window: the cause line and the first-error block name the engine's fatal error at
    the end; a cascade with a few ordinary lines inside it still starts at its first line."""
    info = "(APIServer pid=800) INFO 12-02 05:40:00 [loggers.py:1] Engine 000: 10 tokens/s"
    old = ["(APIServer pid=800) ERROR 12-02 05:12:01 [serving_chat.py:222] Error in "
           "preprocessing prompt inputs",
           "(APIServer pid=800) ValueError: maximum context length is 8192 tokens"]
    fatal = "(EngineCore_DP0 pid=812) ERROR 12-02 06:00:00 [core.py:710] EngineCore fatal error"
    cascade = [fatal, "(EngineCore_DP0 pid=812) torch.OutOfMemoryError: CUDA out of memory",
               *[info] * cause.CALM_GAP,  # the API server's own lines, inside the cascade
               "(APIServer pid=800) ERROR 12-02 06:00:01 [async_llm.py:1] output_handler failed",
               "(APIServer pid=800) vllm.v1.engine.exceptions.EngineDeadError: EngineCore died"]
    out = [info] * 20 + old + [info] * 200 + cascade + ["shutdown noise"] * report.OUTPUT_SHOWN
    r = _record(reason="engine_died", detail="engine process died: pid 812", output=out)
    assert r["cause"][-1] == f"first error in vLLM's output: {fatal}", r["cause"]
    text = report.render(r)
    at = out.index(fatal) + 1
    assert f"== first error in the output (line {at} of {len(out)}) ==\n{fatal}" in text
    assert "preprocessing prompt inputs" not in text
    assert cause.first_error(old + [info] * (cause.CALM_GAP + 1) + cascade) == \
        len(old) + cause.CALM_GAP + 1
    assert cause.first_error(old + [info] * cause.CALM_GAP + cascade) == 0  # one burst
    assert cause.first_error([info, "plain line"]) is None


@pytest.mark.parametrize("aborted", [cause.CALM_GAP + 1, 16, 200])
def test_a_cascade_under_load_is_one_burst_by_vllms_time_stamps(aborted: int) -> None:
    """The engine dies with requests in flight: its traceback, then an access-log line per
    aborted request (more than CALM_GAP of them under load, without time stamps), then the
    API server's errors, a second later. The cause is the engine's error, not the API
    server's EngineDeadError; an old error an hour before stays apart however few lines
    separate it, and errors without stamps are set apart by the line count as before."""
    access = '(APIServer pid=800) INFO:     127.0.0.1:5{:04d} - "POST /v1/completions ' \
        'HTTP/1.1" 500 Internal Server Error'
    fatal = "(EngineCore_DP0 pid=812) ERROR 12-02 06:00:00 [core.py:710] EngineCore fatal error"
    engine = [fatal, "(EngineCore_DP0 pid=812) Traceback (most recent call last):",
              '(EngineCore_DP0 pid=812)   File "core.py", line 701, in run_engine_core',
              "(EngineCore_DP0 pid=812) torch.OutOfMemoryError: CUDA out of memory"]
    api = ["(APIServer pid=800) ERROR 12-02 06:00:01 [async_llm.py:1] output_handler failed",
           "(APIServer pid=800) vllm.v1.engine.exceptions.EngineDeadError: EngineCore died"]
    out = engine + [access.format(i) for i in range(aborted)] + api
    assert cause.first_error(out) == 0
    r = _record(reason="engine_died", detail="engine process died: pid 812", output=out)
    assert r["cause"][-1] == "first error in vLLM's output: (EngineCore_DP0 pid=812) " \
        "torch.OutOfMemoryError: CUDA out of memory", r["cause"]
    old = ["(APIServer pid=800) ERROR 12-02 05:00:00 [serving_chat.py:222] Error in "
           "preprocessing prompt inputs"]
    gap = [access.format(i) for i in range(cause.CALM_GAP + 1)]
    assert cause.first_error(old + gap + out) == len(old + gap)
    late = [api[0].replace("06:00:01", "06:00:30"), api[1]]  # past CASCADE_S: apart
    assert cause.first_error(engine + gap + late) == len(engine + gap)
    unstamped = [line.replace("ERROR 12-02 06:00:00 ", "ERROR ") for line in engine]
    assert cause.first_error(unstamped + gap + api) == len(unstamped + gap)


@pytest.mark.parametrize("reason,code,stays", [
    ("crashloop", 75, False), ("start_memory", 71, False), ("gpu_fault", 74, True),
    ("config", 78, True),
])
def test_a_record_of_an_exit_says_what_the_code_means_and_what_to_do(
        reason: str, code: int, stays: bool) -> None:
    """After the daemon gave up, the head says what its exit code means and what becomes of
    the service under the shipped units (down for good, or started again by systemd), and
    the next step, before the timeline."""
    from vllmwatch.core import exitcodes

    text = report.render(_record(reason=reason, detail="x", exit_code=code))
    said = f"vllmwatch exited with code {code} after this: {exitcodes.MEANING[code]}"
    assert said in text and text.index(said) < text.index("timeline (s before"), text
    nxt = next(line for line in text.splitlines() if line.startswith("next: "))
    assert ("stays down" in nxt and "reset-failed" in nxt) is stays, nxt
    assert ("systemd starts vllmwatch again" in nxt) is not stays, nxt


def test_a_failed_relaunchs_record_says_whose_outage_it_is() -> None:
    """A health (or leak) restart whose relaunch crashed during its start: that crash's
    record read as a lone crash of a serving vLLM; its head says which restart of whose
    outage it is. A lone restart's record has no such line, nor one with an odd field."""
    out = {"began_with": "host_memory", "began_s_ago": 312.4, "restarts": 2}
    text = report.render(_record(reason="crash", detail="during start: exited with code 1",
                                 core={"outage": out}))
    assert "outage: restart 2 since the host_memory restart 5m12s before; no launch since " \
        "served" in text, text
    assert text.index("outage: ") < text.index("timeline (s before"), text
    for core in ({}, {"outage": {**out, "began_s_ago": "x"}}, {"outage": "x"}):
        assert "outage: " not in report.render(_record(reason="crash", detail="x", core=core))


@pytest.mark.parametrize("code", [75, 71, 74, 78])
@pytest.mark.parametrize("cgroup,unit", [
    ("/system.slice/system-vllmwatch.slice/vllmwatch@gpu1.service", "vllmwatch@gpu1"),
    ("/system.slice/vllmwatch.service", "vllmwatch"),
    ("/system.slice/llm-a.service", "llm-a"),
])
def test_the_next_steps_commands_name_the_unit_that_ran(code: int, cgroup: str,
                                                        unit: str) -> None:
    """An instance's crash-loop record said `systemctl stop vllmwatch` and `journalctl -u
    vllmwatch` (another unit, or none: "-- No entries --"); its commands now name the unit
    of the record's cgroup, every one of them."""
    text = report.render(_record(reason="x", detail="x", exit_code=code,
                                 oom={"cgroup": cgroup, "memory_events": None}))
    nxt = next(line for line in text.splitlines() if line.startswith("next: "))
    named = re.findall(r"`(?:systemctl [\w-]+|journalctl -u) ([^`& ]+)", nxt)
    assert named and set(named) == {unit}, nxt
    assert "vllmwatch@NAME" not in nxt, nxt


def test_without_a_service_cgroup_the_next_step_says_the_instances_form_too() -> None:
    from vllmwatch.core import exitcodes

    for cgroup in (None, "/user.slice/user-1000.slice/session-3.scope", "/", "/a/b c.service"):
        assert exitcodes.unit_of(cgroup) is None, cgroup
    for code in (75, 78):
        assert "(for an instance: vllmwatch@NAME)" in exitcodes.after_exit(code)


@pytest.mark.parametrize("key,error,calm", [
    ("levelname", "ERROR", "INFO"), ("level", "error", "info"), ("severity", "CRITICAL", "WARN"),
    ("log.level", "fatal", "debug")])
def test_json_log_lines_are_read_by_their_level(key: str, error: str, calm: str) -> None:
    """vLLM logging through a JSON formatter (VLLM_LOGGING_CONFIG_PATH, for a log shipper):
    the cause is the last burst's first JSON error, found as in vLLM's text lines; an old
    error set apart by ordinary JSON lines is not it."""
    def line(level: str, msg: str, prefix: str = "") -> str:
        return prefix + json.dumps({key: level, "message": msg})
    info = line(calm, "Engine 000: 10 tokens/s", "(APIServer pid=800) ")
    old = [line(error, "Error in preprocessing prompt inputs", "(APIServer pid=800) ")]
    fatal = line(error, "EngineCore fatal error", "(EngineCore_DP0 pid=812) ")
    cascade = [fatal, *[info] * 3, line(error, "output_handler failed")]
    out = old + [info] * (cause.CALM_GAP + 1) + cascade
    assert cause.first_error(out) == out.index(fatal)
    assert cause.first_error(old + [info] * cause.CALM_GAP + cascade) == 0  # one burst
    assert cause.first_error([info, line(calm, "ValueError: quoted in a warning")]) is None
    r = _record(reason="engine_died", detail="engine process died: pid 812", output=out)
    assert r["cause"][-1] == f"first error in vLLM's output: {fatal}", r["cause"]


@pytest.mark.parametrize("text", ['{"levelname": "ERROR"', '{"message": "x"}', "[1, 2]",
                                  '{"level": 3}', "{" * 5000 + "}" * 5000, "x" * 100 + '{"a":1}'])
def test_lines_that_are_not_json_log_lines_are_not_errors(text: str) -> None:
    assert not cause.is_error(text)


_FRAMES = [f'(EngineCore_DP0 pid=812)   File "/x/m{i}.py", line {i}, in f{i}' for i in range(45)]
_LONG = ["(EngineCore_DP0 pid=812) ERROR 12-02 06:00:00 [core.py:710] EngineCore encountered a "
         "fatal error.", "(EngineCore_DP0 pid=812) Traceback (most recent call last):",
         *_FRAMES, "(EngineCore_DP0 pid=812) torch.OutOfMemoryError: CUDA out of memory. Tried "
         "to allocate 2.00 GiB"]


@pytest.mark.parametrize(("lines", "named"), [
    (_LONG, "torch.OutOfMemoryError: CUDA out of memory"),  # 45 frames: past the block
    (["[rank0]: Traceback (most recent call last):", '[rank0]:   File "/x.py", line 1, in f',
      "[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1"],
     "DistBackendError: NCCL error"),
    (["terminate called after throwing an instance of 'c10::Error'", "  what():  CUDA error"],
     "terminate called after throwing"),
    (["[PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog caught collective operation timeout: "
      "WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600000 milliseconds"],
     "Watchdog caught collective operation timeout"),
    (["Fatal Python error: Segmentation fault", "", "Thread 0x1 (most recent call first):"],
     "Fatal Python error: Segmentation fault"),
])
def test_the_cause_names_what_failed_and_the_report_shows_it(lines: list[str],
                                                             named: str) -> None:
    """The cause line was a bare "Traceback (most recent call last):" or "EngineCore
    encountered a fatal error.", a C++ abort or NCCL's watchdog had none, and the first-error
    block of a traceback longer than 30 lines stopped before its exception."""
    info = "(APIServer pid=800) INFO 12-02 05:40:00 [loggers.py:1] Engine 000: 10 tokens/s"
    out = [info] * 20 + lines + [f"(APIServer pid=800) INFO shutdown {i}" for i in range(45)]
    r = _record(reason="engine_died", detail="engine process died: pid 812", output=out)
    assert named in r["cause"][-1], r["cause"]
    head = report.render(r).partition("== last output lines")[0]
    assert named in head.partition("== first error in the output")[2], head


@pytest.mark.parametrize("line", [
    "(EngineCore_DP0 pid=812) torch.OutOfMemoryError: CUDA out of memory.",
    "(APIServer pid=800) RuntimeError: Engine core initialization failed.",
    "[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1",
    "Fatal Python error: Segmentation fault", "(EngineCore_DP0 pid=812) KeyboardInterrupt",
])
def test_vllms_error_lines_go_to_the_journal_at_error_priority(line: str) -> None:
    """`journalctl -p err` missed prefixed tracebacks and deaths below Python (priority 6)."""
    from vllmwatch.shell.childlog import level_of
    assert level_of(line, "info") == "error"
    frame = '(EngineCore_DP0 pid=812)   File "/x.py", line 1, in f'
    assert level_of(frame, "error") == "error" and level_of(frame, "info") == "info"


def test_a_hangs_cause_is_not_an_error_vllm_logged_normally_after() -> None:
    """A hung engine goes silent, so no calm gap follows a client's 400 minutes before: the
    cause line named that 400 as the hang's first error."""
    a = "(APIServer pid=800) "
    info = a + "INFO 12-02 05:50:00 [loggers.py:1] Engine 000: 95.1 tokens/s, Running: 12 reqs"
    old = [a + "ERROR 12-02 05:51:02 [serving_chat.py:1] Error in preprocessing prompt inputs",
           a + "ValueError: This model's maximum context length is 8192 tokens."]
    out = [info] * 30 + old + [a + 'INFO:     10.0.0.7:40000 - "POST /v1/chat/completions '
                               'HTTP/1.1" 400 Bad Request', info]
    hang = _record(reason="hang", detail="canary timed out twice", output=out)
    assert hang["cause"][-1].startswith("an earlier error in vLLM's output, which logged "
                                        "normally after it (so likely not the hang's cause)")
    # silent after its error: the error is the hang's first error
    stuck = _record(reason="hang", detail="canary timed out twice", output=[info] * 30 + old)
    assert stuck["cause"][-1].startswith("first error in vLLM's output: ")
    crash = _record(reason="engine_died", detail="x", output=out)  # not a hang: as before
    assert crash["cause"][-1].startswith("first error in vLLM's output: ")


def test_a_bad_field_in_the_head_keeps_its_cause_lines() -> None:
    r = _record(reason="engine_died", detail="engine process died: pid 812",
                output=["(EngineCore_DP0 pid=812) torch.OutOfMemoryError: CUDA out of memory"])
    r["tree"] = ["not", "a", "table"]
    text = report.render(r)
    assert "cause: first error in vLLM's output: (EngineCore_DP0 pid=812) torch.Out" in text
    assert "(not shown: a field has an unexpected shape" in text


@pytest.mark.parametrize("reason", ["gpu_memory", "host_memory"])
def test_a_memory_restarts_cause_is_not_an_error_vllm_logged_normally_after(
        reason: str) -> None:
    """A memory rule is vllmwatch's own measure of a serving engine: a client's 400 that vLLM
    logged minutes before, and went on serving after, was the record's "cause: first error in
    vLLM's output" under "reason: gpu_memory: GPU memory ... above its baseline"."""
    a = "(APIServer pid=800) "
    info = a + "INFO 12-02 05:50:00 [loggers.py:1] Engine 000: 95.1 tokens/s, Running: 12 reqs"
    old = [a + "ERROR 12-02 05:51:02 [serving_chat.py:1] Error in preprocessing prompt inputs",
           a + "ValueError: This model's maximum context length is 8192 tokens."]
    out = [info] * 30 + old + [info] * 5
    r = _record(reason=reason, detail="GPU memory 137120 MiB is 7168 MiB above its baseline",
                output=out)
    assert r["cause"][-1].startswith("an earlier error in vLLM's output, which logged "
                                     f"normally after it (so likely not the {reason}'s cause)")
    text = report.render(r)
    assert "cause: first error in vLLM's output" not in text


def test_memory_samples_and_the_timeline_read_in_tenths_of_a_second_and_whole_mib() -> None:
    """A host_memory record (the figures of a real one: PSS in fractions of a MiB, samples
    0.5 s apart) printed `host 27.3037 MiB`, two samples at `-1s` and the newest at `-0s`; a
    timeline entry 0.04 s before the incident read `-0.0`. Each sample and entry now reads
    in the timeline's tenths, never a negative zero, and MiB whole as the rest of the page."""
    recent = [{"s_ago": ago, "gpu_rule_mib": None, "host_rule_mib": mib} for ago, mib in
              ((1.503, 27.3037), (1.002, 58.2402), (0.501, 82.5049), (0.0, 107.263))]
    shown = report.render({
        "id": "20261206T155828Z-host_memory", "reason": "host_memory", "detail": "d",
        "timeline": [[-2.2, "child started"], [-0.04, "start phase weights"], [0.0, "x"]],
        "memory": {"samples": {"sustain": 2, "recent": recent}}})
    lines = shown.splitlines()
    at = lines.index(next(ln for ln in lines if ln.startswith("samples the memory rules")))
    assert [ln.split() for ln in lines[at + 1:at + 5]] == [
        ["-1.5", "GPU", "-", "host", "27", "MiB"], ["-1.0", "GPU", "-", "host", "58", "MiB"],
        ["-0.5", "GPU", "-", "host", "83", "MiB"], ["0.0", "GPU", "-", "host", "107", "MiB"]]
    assert "-0.0" not in shown and "-0s" not in shown, shown
    assert any(ln.split() == ["0.0", "start", "phase", "weights"] for ln in lines), shown


def test_a_tree_already_gone_has_no_host_rss_figure() -> None:
    """A crash's record (the tree gone before it was taken) said `host RSS of the tree: 0.0
    MiB` under `tree: ... already gone`: the sum of no process, read as a vLLM using none."""
    shown = report.render({"id": "20261206T160415Z-crash", "reason": "crash", "detail": "d",
                           "tree": {"alive": False, "processes": [], "host_rss_mib": 0.0}})
    assert "host RSS of the tree: - (no process of it was left)" in shown, shown
    assert "0.0 MiB" not in shown, shown


@pytest.mark.parametrize("cgroup", ["/", "/system.slice/docker-0123abcd.scope",
                                    "/user.slice/user-1000.slice/session-3.scope"])
@pytest.mark.parametrize("code", [75, 78])
def test_a_record_of_a_vllmwatch_that_ran_as_no_service_names_no_systemd(
        cgroup: str, code: int) -> None:
    """In a Kubernetes pod (contrib/kubernetes) or a terminal, a give-up's record said
    "systemd starts vllmwatch again in RestartSec (10 s)" and gave `systemctl` and
    `journalctl -u vllmwatch` commands: no systemd ran it. A record whose cgroup was read and
    is no service says that whatever started it decides, and gives no systemd command."""
    text = report.render(_record(reason="x", detail="x", exit_code=code,
                                 oom={"cgroup": cgroup, "memory_events": None}))
    nxt = next(line for line in text.splitlines() if line.startswith("next: "))
    assert "ran as no systemd service" in nxt and "whatever started it decides" in nxt, nxt
    assert "systemctl" not in nxt and "journalctl" not in nxt and "RestartSec" not in nxt, nxt
