"""`check` refuses two vllmwatch instances that claim the same GPU or port (issue 17)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllmwatch.check import neighbours
from vllmwatch.check.base import FAIL, PASS, WARN, Context
from vllmwatch.config.schema import load


def _write(path: Path, port: int, status: int, gpus: str | None, bind: str | None = None
           ) -> Path:
    lines = ["[vllm]", 'model = "/m"', f"port = {port}"]
    if gpus is not None:
        lines.append(f"gpus = {gpus}")
    if bind is not None:
        lines += ["[vllm.env]", f'VLLM_CPU_OMP_THREADS_BIND = "{bind}"']
    lines += ["[status]", f'listen = "127.0.0.1:{status}"']
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("mine", "theirs", "status", "needle"), [
    ((8000, 9101, "[0]"), (8001, 9102, "[1]"), PASS, "no clash with 1"),
    ((8000, 9101, "[0]"), (8000, 9102, "[1]"), FAIL, "port 8000"),
    ((8000, 9101, "[0]"), (8001, 9101, "[1]"), FAIL, "port 9101"),
    ((8000, 9101, "[0]"), (8001, 9102, "[0, 1]"), FAIL, "GPU 0"),
    ((8000, 9101, None), (8001, 9102, "[1]"), FAIL, "takes every GPU"),
    ((8000, 9101, "[]"), (8001, 9102, None), PASS, "no clash"),  # a CPU instance
    ((8000, 9101, "[]"), (8001, 9102, "[]"), WARN, "VLLM_CPU_OMP_THREADS_BIND"),  # both auto
    ((8000, 9101, "[0]"), (9101, 9102, "[1]"), FAIL, "vllm.port here, status.listen there"
     .replace("vllm.port here, status.listen there", "port 9101")),
])
def test_two_instances(tmp_path: Path, mine: tuple[int, int, str | None],
                       theirs: tuple[int, int, str | None], status: str, needle: str) -> None:
    a = _write(tmp_path / "a.toml", *mine)
    _write(tmp_path / "b.toml", *theirs)
    got = neighbours.check_neighbours(Context(load(str(a))))
    assert got.status == status and needle in got.detail, got


def test_a_file_that_is_not_a_config_is_named_not_fatal(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.toml", 8000, 9101, "[0]")
    (tmp_path / "notes.toml").write_text("this is = = not toml\n")
    got = neighbours.check_neighbours(Context(load(str(a))))
    assert got.status == PASS and "notes.toml" in got.detail


@pytest.mark.parametrize(("mine", "theirs", "status", "needle"), [
    ("0-3", "4-7", PASS, "no clash"),
    ("0-3", "3,8", WARN, "CPU 3"),
    ("0|1", "1", WARN, "CPU 1"),  # one list per TP rank, "|" between them
    ("nobind", "nobind", PASS, "no clash"),  # unbound: the scheduler spreads them
    ("0-3", None, WARN, "not set to distinct CPUs"),  # the other is "auto"
    ("auto", "4-7", WARN, "not set to distinct CPUs"),
    ("zero", "4-7", WARN, "not set to distinct CPUs"),  # unreadable: vLLM decides
])
def test_two_cpu_instances_must_not_share_cores(tmp_path: Path, mine: str, theirs: str | None,
                                                 status: str, needle: str) -> None:
    """vLLM's CPU workers of two instances on one core: the idle one's spinning starves the
    other's start (seen in CI), so `check` warns unless each has its own CPUs."""
    a = _write(tmp_path / "a.toml", 8000, 9101, "[]", mine)
    _write(tmp_path / "b.toml", 8001, 9102, "[]", theirs)
    got = neighbours.check_neighbours(Context(load(str(a))))
    assert got.status == status and needle in got.detail, got


def test_cpu_binding_is_not_asked_of_gpu_instances(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.toml", 8000, 9101, "[0]")
    _write(tmp_path / "b.toml", 8001, 9102, "[1]")
    assert neighbours.check_neighbours(Context(load(str(a)))).status == PASS


@pytest.mark.parametrize("me,other", [("gpu0.toml", "vllmwatch.toml"),
                                      ("vllmwatch.toml", "gpu0.toml")])
def test_the_packaged_config_beside_an_instance_is_a_warn(tmp_path: Path, me: str,
                                                          other: str) -> None:
    """balancers.md's set-up (`cp vllmwatch.toml gpu0.toml`, gpus = [0]) FAILed check at
    every instance's ExecStartPre: the packaged /etc/vllmwatch/vllmwatch.toml (every GPU,
    port 8000) is vllmwatch.service's, which does not run beside the instances."""
    a = _write(tmp_path / me, 8000, 9101, "[0]" if me != "vllmwatch.toml" else None)
    _write(tmp_path / other, 8000, 9101, "[0]" if other != "vllmwatch.toml" else None)
    got = neighbours.check_neighbours(Context(load(str(a))))
    assert got.status == WARN and "vllmwatch.service" in got.detail and "port 8000" in \
        got.detail, got


def test_two_gates_on_one_port_clash(tmp_path: Path) -> None:
    """gate.listen is where clients come: two instances' gates on one port PASSed."""
    for name, port, status, gpus in (("a.toml", 8001, 9101, "[0]"), ("b.toml", 8002, 9102,
                                                                     "[1]")):
        path = _write(tmp_path / name, port, status, gpus)
        path.write_text(path.read_text() + '[gate]\nenabled = true\nlisten = "0.0.0.0:8000"\n')
    got = neighbours.check_neighbours(Context(load(str(tmp_path / "a.toml"))))
    assert got.status == FAIL and "port 8000 (gate.listen here, gate.listen there)" in \
        got.detail, got
