"""Pure pieces of incident records as tables: redaction, stack parsing, metrics, the report."""

from __future__ import annotations

from typing import Any

import pytest

from vllmwatch.config.launch import secrets_of
from vllmwatch.config.redact import Redactor
from vllmwatch.config.schema import from_dict
from vllmwatch.core import incidents, machine
from vllmwatch.core.names import Reason
from vllmwatch.incident import dumpers, metrics, record, report

R = Redactor(["s3cr3t-value-1234"])


@pytest.mark.parametrize("text,want", [
    ("--api-key abc123 --port 8000", "--api-key <redacted> --port 8000"),
    ("--hf-token=hf_x", "--hf-token=<redacted>"),
    ("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz1", "HF_TOKEN=<redacted>"),
    ("Authorization: Bearer xyz.abc", "Authorization: Bearer <redacted>"),
    ('{"api_key": "zzz"}', '{"api_key": "<redacted>"}'),
    ("non-default args: {'api_key': ['zzz9']}", "non-default args: {'api_key': ['<redacted>']}"),
    ("token sk-abcdefghijklmnopqrstu here", "token <redacted> here"),
    ("it printed s3cr3t-value-1234 somewhere", "it printed <redacted> somewhere"),
    # vLLM's own numbers stay: names that end in "tokens" are counts, not credentials
    ("--max-num-batched-tokens 2048", "--max-num-batched-tokens 2048"),
    ("prompt_tokens=5 generation_tokens=7", "prompt_tokens=5 generation_tokens=7"),
    ('vllm:prompt_tokens_total{model_name="m"} 12', 'vllm:prompt_tokens_total{model_name="m"} 12'),
])
def test_redaction(text: str, want: str) -> None:
    assert R.text(text) == want


def test_redaction_of_structures_and_environments() -> None:
    env = {"HF_TOKEN": "hf_secret_value", "VLLM_API_KEY": "k-very-secret", "HOME": "/h"}
    red = Redactor(secrets_of(env, "the-api-key"))
    assert red.env(env) == {"HF_TOKEN": "<redacted>", "VLLM_API_KEY": "<redacted>",
                            "HOME": "/h"}
    doc: dict[str, Any] = {"a": ["say the-api-key"], "password": "x1", "n": 3,
                           "prompt_tokens": 5}
    assert red.deep(doc) == {"a": ["say <redacted>"], "password": "<redacted>", "n": 3,
                             "prompt_tokens": 5}
    assert red.argv(["vllm", "--api-key", "the-api-key"]) == ["vllm", "--api-key",
                                                              "<redacted>"]


PYSPY = '''Process 17600: python dl.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 17600 (idle): "MainThread"
    run_busy_loop (vllm/v1/engine/core.py:1551)
    <module> (dl.py:5)
Thread 0x7F11 (active): "worker"
    f (dl.py:3)
'''
FAULT = '''Thread 0x00007f8 (most recent call first):
  File "/x/vllm/v1/engine/core.py", line 1588 in _process_input_queue
  File "/x/threading.py", line 1002 in _bootstrap

Current thread 0x00007f9 (most recent call first):
  File "/x/site.py", line 5 in <module>
'''


def test_stack_parsers() -> None:
    main, worker = dumpers.parse_pyspy(PYSPY)
    assert main.name == "MainThread (idle)"
    assert main.frames[0] == dumpers.Frame("run_busy_loop", "vllm/v1/engine/core.py", 1551)
    assert worker.name == "worker (active)" and worker.frames[0].function == "f"
    other, current = dumpers.parse_faulthandler(FAULT)
    assert other.frames[0].function == "_process_input_queue" and not other.current
    assert current.current and current.frames[0].line == 5


def test_metrics_keeps_one_scrape_a_minute_and_shows_what_moved() -> None:
    scrapes: list[tuple[float, str]] = []
    for t, tokens in ((0, 1), (30, 5), (61, 9), (62, 9), (90, 9)):
        scrapes = metrics.keep(scrapes, float(t), f"# HELP x\nvllm:gen_total {tokens}\n"
                               f"vllm:running 2\nprocess_cpu 4\n")
    assert [t for t, _ in scrapes] == [0.0, 61.0, 90.0]
    section = metrics.section(scrapes, 95.0)
    assert section["last"] == {"vllm:gen_total": 9.0, "vllm:running": 2.0}
    assert section["moved"] == [["vllm:gen_total", 1.0, 9.0]]
    assert section["unchanged"] == ["vllm:running"] and section["last_age_s"] == 5.0
    assert metrics.section([], 1.0)["last"] is None


CFG = from_dict({"vllm": {"model": "/m"}})


@pytest.mark.parametrize("reason,wanted", [
    ("hang", True), ("crash", True), ("health", True), ("stall", True), ("gpu_fault", True),
    ("start_timeout", True), ("start_stall", True), ("gpu_memory", True),
    ("host_memory", True), ("start_memory", True), ("manual", False), ("reload", False),
])
def test_which_reasons_get_a_record(reason: str, wanted: bool) -> None:
    assert incidents.wanted(machine.initial(CFG, 0.0), Reason(reason)) is wanted


def _record() -> dict[str, Any]:
    facts = {"uptime_s": 60.0, "ready_for_s": 30.0, "start_phases_s": {"weights": 10.0},
             "config_sha256": "abc"}
    inp = record.Inputs(seq=1, reason="hang", detail="canary timed out", exit_code=None,
                        timeout=3.0, pgid=None, child_pid=None, facts=facts,
                        output=["line 1", "--api-key sekrit"],
                        scrapes=[(0.0, "vllm:x 1\n"), (60.0, "vllm:x 2\n")])
    stacks: record.StackDumps = [(7, [dumpers.Dump("py-spy", True,
                                                   dumpers.parse_pyspy(PYSPY))])]
    return record.build(inp, "20261201T000000Z-hang", 61.0, [], stacks,
                        {"py-spy": "ran for all 1 processes"}, Redactor())


def test_the_report_has_its_sections_in_order_and_vllm_frames_first() -> None:
    text = report.render(_record())
    heads = ["== reason and timeline", "== what each vLLM thread", "== metrics that moved",
             "== memory and GPU", "== last output lines"]
    assert [text.index(h) for h in heads] == sorted(text.index(h) for h in heads)
    assert "vllm: run_busy_loop (vllm/v1/engine/core.py:1551)" in text
    assert "vllm:x: 1 -> 2" in text
    assert "--api-key <redacted>" in text and "sekrit" not in text
    assert "-60.0  child started" in text and "-50.0  start phase weights" in text


def test_the_record_says_when_the_tree_was_gone() -> None:
    rec = _record()
    assert rec["tree"]["alive"] is False and "already gone" in rec["tree"]["note"]


def test_the_memory_section_is_read_as_words_not_as_python_values() -> None:
    gpu = {"memory": {
        "last_sample": {"source": "nvml-process", "gpu_tree_mib": 131104.0,
                        "gpu_tree_by_gpu_mib": {"0": 131104.0},
                        "device_used_mib": {"0": 131719.2}, "device_total_mib": {"0": 143771.0},
                        "host_rss_mib": 2870.73046875, "host_pss_mib": None,
                        "gpu_faults": [], "tree_cpu_s": 35.49},
        "gpu_now": {"driver": "580.159", "gpus": {"0": "NVIDIA H200"},
                    "device_used_mib": {"0": 615.0},
                    "processes": [{"pid": 7, "gpu_index": 0, "used_mib": 512.0}]}},
        "tree": {"host_rss_mib": 635.25, "processes": []}}
    text = report.render(gpu)
    assert ("last sample (source nvml-process): GPU tree 131104 MiB (gpu 0 131104 MiB), device "
            "used (gpu 0 131719 MiB / 143771 MiB), host RSS 2871 MiB, CPU 35.5 s, GPU faults: "
            "none") in text
    assert "NVML now: driver 580.159; gpu 0 NVIDIA H200; device used (gpu 0 615 MiB); " \
           "processes: pid 7 on gpu 0 512 MiB" in text
    assert "host RSS of the tree: 635 MiB" in text
    cpu = {"memory": {"last_sample": {"source": "none", "host_rss_mib": 2870.7,
                                      "host_pss_mib": 2480.2, "gpu_tree_mib": None,
                                      "device_used_mib": {}, "gpu_faults": [
                                          {"gpu_index": 1, "kind": "xid", "detail": "Xid 79"}]},
                      "gpu_now": {"device_used_mib": {}, "processes": None}}}
    text = report.render(cpu)
    assert "last sample (source none): host RSS 2871 MiB, PSS 2480 MiB, GPU faults: gpu 1 xid " \
           "(Xid 79)" in text
    assert "NVML now: not read" in text
    for shown in ("None", "{}", "[]", "2870.7"):  # no Python value leaks into the page
        assert shown not in text.split("== memory and GPU ==")[1], shown


def test_a_dump_that_read_no_thread_gives_way_to_one_that_did() -> None:
    def proc(dumps: list[dict[str, Any]]) -> dict[str, Any]:
        return {"stacks": {"methods": {}, "processes": [
            {"role": "worker", "pid": 9, "dumps": dumps}]}}
    frames = {"name": "MainThread", "frames": [["run", "vllm/x.py", 3]]}
    both = proc([{"method": "py-spy", "ok": True, "threads": []},
                 {"method": "faulthandler", "ok": True, "threads": [frames]}])
    assert "worker pid 9 (faulthandler, 1 threads):" in report.render(both)
    none = proc([{"method": "py-spy", "ok": True, "threads": []}])
    assert "worker pid 9 (py-spy: no Python thread read)" in report.render(none)


def test_the_report_shows_control_characters_as_escapes() -> None:
    rec = {"reason": "crash", "detail": "exit\x1b]0;x\x07", "output": [
        "\x1b[31mERROR\x1b[0m engine died\r", "plain line"],
        "stacks": {"methods": {}, "processes": [{"role": "api_server", "pid": 1, "dumps": [
            {"method": "py-spy", "ok": True,
             "threads": [{"name": "t\x1b[2J", "frames": [["f", "vllm/a.py", 1]]}]}]}]}}
    text = report.render(rec)
    assert not any(c in text for c in ("\x1b", "\x07", "\r"))
    assert "\\x1b[31mERROR\\x1b[0m engine died\\x0d" in text and "plain line" in text
    assert "thread t\\x1b[2J" in text
    assert "\n" in text  # the page keeps its lines


@pytest.mark.parametrize(("figures", "line"), [
    ({"failed": 3, "replayed": 3, "cut": 1, "in_flight": 4},
     "gate: 4 requests in flight: 3 replayed, 1 cut"),
    ({"failed": 2, "not_replayed": 2, "in_flight": 2},
     "gate: 2 requests in flight: 0 replayed, 0 cut; 2 not replayed (answered 502 or 504, "
     "or vLLM's own aborted answer passed on)"),
    ({"failed": 1, "replayed": 1, "answered": 2, "open": 1, "in_flight": 4},
     "gate: 4 requests in flight: 1 replayed, 0 cut; 2 answered, 1 still open when recorded"),
])
def test_the_record_says_what_became_of_the_requests_in_flight(
        figures: dict[str, int], line: str) -> None:
    """Issue 35: the gate's figures of the engine that went, in the record and its report."""
    assert "requests in flight" not in report.render(_record())  # no gate: no line
    inp = record.Inputs(seq=1, reason="hang", detail="d", exit_code=None, timeout=3.0,
                        pgid=None, child_pid=None, facts={}, gate=figures)
    rec = record.build(inp, "20261201T000000Z-hang", 1.0, [], [], {}, Redactor())
    assert rec["gate"] == figures
    assert line in report.render(rec).splitlines()


def test_a_record_is_json_every_parser_reads() -> None:
    """A NaN gauge made record.json and `show --json` invalid JSON (JSON.parse refuses it)."""
    import json

    from vllmwatch.incident import store
    text = store.dumps({"kv": float("nan"), "m": [float("inf"), 1.5], "t": {"x": -float("inf")}})

    def refuse(name: str) -> None:
        raise ValueError(name)
    assert json.loads(text, parse_constant=refuse) == {"kv": None, "m": [None, 1.5],
                                                       "t": {"x": None}}


@pytest.mark.parametrize(("value", "shown"), [(123456789.0, "123456789"), (0.5, "0.5"),
                                              (3.0, "3"), (0.00167, "0.00167"), (None, "-")])
def test_figures_read_as_counted(value: float | None, shown: str) -> None:
    """Counters were `1.23457e+08 -> 1.23457e+08` across a move that changed them."""
    assert report._num(value) == shown


def test_a_slow_rate_is_not_rounded_to_zero() -> None:
    lab = 'engine="0",model_name="m"'
    scrapes = [(t, f"vllm:request_success_total{{{lab}}} {n}\n")
               for t, n in ((1000.0, 5.0), (1600.0, 6.0))]
    summary = metrics.summary(scrapes, 1600.0)  # one request in 10 minutes
    assert summary["requests_finished_per_s"] == pytest.approx(1 / 600, rel=0.01)
