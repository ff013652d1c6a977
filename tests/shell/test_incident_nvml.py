"""A record is written within its timeout when NVML does not answer.

A wedged NVIDIA driver (a GPU off the bus, Xid 79) hangs NVML's calls for good, and that is
when records matter most. The record read the driver's version, the GPU names, every GPU
process and the device memory on its worker with no deadline: the record never came (the
core went on after its own wait, the incident.timeout event), and each such restart held
one of the loop's few I/O workers for good, until the probes had none left."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vllmwatch.config.schema import from_dict
from vllmwatch.core.actions import RecordIncident
from vllmwatch.core.names import Reason
from vllmwatch.incident import store
from vllmwatch.shell.incidents import IncidentShell
from vllmwatch.testing.world import LogCapture

TIMEOUT = 1.0  # [incidents] timeout of the record


class _Wedged:
    """NVML as a wedged driver leaves it: every call blocks until the test ends."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def _block(self) -> Any:
        self.release.wait()
        return None

    def describe(self) -> dict[str, Any]:
        return self._block() or {}

    def gpu_processes(self) -> None:
        return self._block()  # type: ignore[no-any-return]

    def device_used_mib(self) -> dict[int, float]:
        return self._block() or {}


@pytest.fixture
def release() -> Iterator[threading.Event]:
    done = threading.Event()
    yield done
    done.set()  # the blocked reads end with the test


def test_a_record_is_written_in_time_when_nvml_hangs(tmp_path: Path,
                                                      release: threading.Event) -> None:
    (tmp_path / "state").mkdir(mode=0o700)
    shell = IncidentShell(from_dict({"vllm": {"model": "/m"}}), LogCapture(),
                          {"STATE_DIRECTORY": str(tmp_path / "state")})
    answers: list[Any] = []
    for seq in (1, 2):  # the second while the first's read is still stuck
        worker = threading.Thread(target=lambda seq=seq: answers.append(shell.record(
            RecordIncident(seq, Reason.GPU_FAULT, "Xid 79", TIMEOUT, None), None, None,
            _Wedged(release))), daemon=True)  # type: ignore[arg-type]  # the calls it makes
        t0 = time.monotonic()
        worker.start()
        worker.join(TIMEOUT + 2.0)
        assert not worker.is_alive(), f"record {seq} still not written after " \
            f"{time.monotonic() - t0:.1f}s (timeout {TIMEOUT}s)"
    assert all(not got.error for got in answers), answers
    assert shell.root is not None
    for got in answers:
        rec = store.load(shell.root, got.incident_id)
        assert rec is not None and "NVML" in rec["memory"]["gpu_now"]["error"], rec
