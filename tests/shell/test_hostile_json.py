"""Hostile JSON from vLLM (nesting deeper than Python's stack, 1e999999, NaN) read by the
daemon's worker threads ends in a result with a reason, never an exception that kills the
thread with a raw traceback on stderr (json.loads raises RecursionError, not ValueError)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support import TIMEOUT_SCALE, free_port, wait_for
from tests.support.tinylora import make
from vllmwatch.config import smoke
from vllmwatch.config.schema import from_dict
from vllmwatch.config.sections import Config
from vllmwatch.core import canary, smokeanswers
from vllmwatch.shell.adapters import AdapterWatch
from vllmwatch.testing.world import LogCapture

DEEP = b"[" * 100_000 + b"]" * 100_000  # 200 KB: under MAX_ANSWER, past the stack
ODD = b'{"data": [{"id": 1e999999}, {"id": NaN}, {"id": "a"}]}'


@contextmanager
def vllm_answering(models: bytes, refusal: bytes = DEEP) -> Iterator[int]:
    """A stand-in for vLLM: /v1/models answers `models`, a load is refused with `refusal`."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(200, models)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._answer(400, refusal)

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5.0)


def config(port: int, tmp: Path) -> Config:
    return from_dict({"vllm": {"model": "base", "port": port, "gpus": []},
                      "adapters": [{"name": "a", "path": str(make(tmp / "a"))}],
                      "lora": {"live": True, "max_loras": 4}})


@pytest.fixture
def crashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Threads that died of an exception (threading.excepthook), by name."""
    died: list[str] = []
    monkeypatch.setattr(threading, "excepthook",
                        lambda args: died.append(f"{args.thread and args.thread.name}: "
                                                 f"{args.exc_type.__name__}"))
    return died


def state(watch: AdapterWatch) -> str:
    return str(watch.view(True)["managed"][0]["state"])


def test_a_model_list_nested_past_the_stack_is_a_failed_refresh(crashes: list[str],
                                                              tmp_path: Path) -> None:
    with vllm_answering(DEEP) as port:
        log = LogCapture()
        watch = AdapterWatch(config(port, tmp_path), log)
        watch.refresh()  # the worker's own call: raised RecursionError before
        assert state(watch) == "unknown"
        said = log.named("lora.models_unreadable")
        assert len(said) == 1 and said[0]["error"].startswith("RecursionError")
        watch.refresh()  # the same answer again: said once
        assert len(log.named("lora.models_unreadable")) == 1
        watch.observe(True, 1)  # ... and on the thread observe starts for it
        wait_for(lambda: not [t for t in threading.enumerate()
                              if t.name == "vllmwatch-adapters"], 10, "the refresh thread")
    assert crashes == []


def test_huge_numbers_and_nan_in_the_model_list_are_read(crashes: list[str],
                                                              tmp_path: Path) -> None:
    with vllm_answering(ODD) as port:
        watch = AdapterWatch(config(port, tmp_path), LogCapture())
        watch.refresh()
        assert state(watch) == "loaded"
        assert set(watch.view(True)["unmanaged"]) == {"inf", "nan"}
    assert crashes == []


def test_a_refusal_nested_past_the_stack_is_a_failed_load(crashes: list[str],
                                                              tmp_path: Path) -> None:
    with vllm_answering(b'{"data": []}') as port:
        log = LogCapture()
        watch = AdapterWatch(config(port, tmp_path), log)
        first = watch.update(config(port, tmp_path).adapters, (), ())
        second = watch.update(config(port, tmp_path).adapters, (), ())  # queued behind it
        first.join(10 * TIMEOUT_SCALE)
        second.join(10 * TIMEOUT_SCALE)
        assert first.done.is_set() and second.done.is_set()
        failed = log.named("lora.load_failed")
        assert len(failed) == 2 and failed[0]["error"].startswith("HTTP 400: [[[")
        assert watch.loads_failed == 2 and state(watch) == "failed"
    assert crashes == []


def test_the_canarys_and_smoke_checks_answers_nested_past_the_stack_are_failures() -> None:
    """Read on a probe worker: a RecursionError was an io.failed event with a traceback; now
    the answer is what it is, not JSON, and the canary or the check fails with that reason."""
    assert canary.answer_problem("chat", DEEP).startswith("not JSON")
    assert canary.route_missing(404, DEEP) is False
    check = smoke.parse([{"endpoint": "chat"}])[0][0]
    assert smokeanswers.problem(check, 200, DEEP).endswith("but not JSON")
    assert smokeanswers.vllm_error(DEEP) == ""  # an error answer with no message of vLLM's
    assert smokeanswers.problem(check, 500, DEEP) == smokeanswers.problem(check, 500, b"")


def test_a_canary_answer_that_counts_nan_tokens_is_no_answer() -> None:
    body = b'{"choices": [{"text": ""}], "usage": {"completion_tokens": NaN}}'
    assert "usage.completion_tokens is nan" in canary.answer_problem("completions", body)
    ok = b'{"choices": [{"text": ""}], "usage": {"completion_tokens": 1}}'
    assert canary.answer_problem("completions", ok) == ""
