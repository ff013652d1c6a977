"""A spare NVML gives no figure for (a container without the host's PID namespace): its build
answers SpareBuilt.permanent, so the core turns the spare off at once instead of retrying a
full vLLM start spare.retries times. A tree that died before its figure was read is no such
host: an ordinary failed build. The spare is a small Python process; its HTTP is faked."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import PYTHON, TIMEOUT_SCALE, wait_for
from vllmwatch.config.schema import from_dict
from vllmwatch.config.spare import SparePlan
from vllmwatch.core.events import Event
from vllmwatch.core.failover import BuildSpare, SpareBuilt
from vllmwatch.shell import sparetree
from vllmwatch.shell.sparerun import SpareFx
from vllmwatch.shell.sparetree import NVML_FAILED, UNMEASURED, SpareCommand, SpareTree
from vllmwatch.testing.driver import LogCapture

# a lifetime, not a wait: its owner kills it
SPARE = "import time\nprint('INFO hello from the spare', flush=True)\ntime.sleep(600)\n"


def _build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
           figure: Callable[[SpareTree], float | None],
           listed: Callable[[], bool] | None = None) -> SpareBuilt:
    """One build through SpareFx (as the loop asks it) of a spare that answers /health,
    its canary, /sleep and /is_sleeping; `figure`: NVML's figure for its tree, each read;
    `listed`: whether NVML answered its process list on the second look (else: it did)."""
    def call(path: str, method: str, url: str, *a: object, **k: object) -> tuple[int, bytes]:
        return 200, b'{"choices": [{"text": "x"}]}'
    monkeypatch.setattr(sparetree, "call", call)
    cmd = SpareCommand([PYTHON, "-c", SPARE], {}, str(tmp_path / "s.sock"), "m")
    listing = None if listed is None else (lambda _: (figure(t), listed()))
    t = SpareTree(cmd, "0123456789abcdef", LogCapture(), lambda _: figure(t), lambda: 1e6,
                  listing=listing)
    monkeypatch.setattr(t, "_get", lambda url, timeout=2.0: (
        200, json.dumps({"is_sleeping": True}).encode()))
    config = from_dict({"vllm": {"command": ["vllm", "serve"], "model": "m", "gpus": []}},
                       path=str(tmp_path / "vllmwatch.toml"))
    fx = SpareFx(config, SparePlan(on=True, reason="test"), t, LogCapture())
    posted: list[Event] = []
    try:
        fx.do(BuildSpare(30.0, 3), posted.append)
        wait_for(lambda: bool(posted), 30.0, "the build's answer")
    finally:
        t.stop("test ends")
        t.stops.wait()  # its waits run on a thread: wait for the end
    assert len(posted) == 1 and isinstance(posted[0], SpareBuilt), posted
    assert not posted[0].ok and posted[0].build == 3, posted[0]
    return posted[0]


@pytest.mark.parametrize("which", ["awake", "awake-zero", "asleep"])
def test_no_nvml_figure_for_the_spare_is_a_permanent_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str) -> None:
    reads: list[float | None] = {"awake": [None], "awake-zero": [0.0],
                                 "asleep": [27202.0, None]}[which]
    got = _build(tmp_path, monkeypatch, lambda _: reads.pop(0) if len(reads) > 1 else reads[0])
    assert got.permanent and got.detail == UNMEASURED, got


def test_a_tree_that_died_before_its_figure_is_an_ordinary_failed_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its pids are gone, so NVML lists none of them: that says nothing of the host."""
    def dies(t: SpareTree) -> float | None:
        assert t.proc is not None
        t.proc.kill()
        t.proc.wait(10.0 * TIMEOUT_SCALE)
        return None
    got = _build(tmp_path, monkeypatch, dies)
    assert not got.permanent and "exited during its build" in got.detail, got


@pytest.mark.parametrize("reads", [[None, 27202.0], [27202.0, None, 1932.0]],
                         ids=["awake", "asleep"])
def test_one_missing_figure_is_an_ordinary_failed_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads: list[float | None]) -> None:
    """NVML's call failed once (the sampler's _call gives None), or the engine was dying under
    a live API server: the second look, a second later, has a figure. Nothing says the host
    cannot measure the spare: retried as any failed build, never off until a reload."""
    got = _build(tmp_path, monkeypatch, lambda _: reads.pop(0) if len(reads) > 1 else reads[0])
    assert not got.permanent and got.detail == UNMEASURED, got


@pytest.mark.parametrize("which", ["awake", "asleep"])
def test_nvmls_list_failing_on_both_looks_is_an_ordinary_failed_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str) -> None:
    """NVML's process-list call failed at the figure and again a second later (a driver
    hiccup, NVML_ERROR_UNKNOWN): that says nothing of what the host can measure, so the
    build is retried as any failed build, and says the call failed, not "a container"."""
    reads: list[float | None] = {"awake": [None], "asleep": [27202.0, None]}[which]
    got = _build(tmp_path, monkeypatch, lambda _: reads.pop(0) if len(reads) > 1 else reads[0],
                 listed=lambda: False)
    assert not got.permanent and got.detail == NVML_FAILED, got


def test_a_list_without_the_spare_on_the_second_look_is_permanent_even_after_a_failed_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first look's call failed; the second answered and lists none of the spare's
    processes: that is the host (NVML cannot see them), off at once."""
    got = _build(tmp_path, monkeypatch, lambda _: None, listed=lambda: True)
    assert got.permanent and got.detail == UNMEASURED, got
