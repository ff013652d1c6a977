"""Pre-warm: cache placement, page-cache warming, kernel step, time-outs and failures."""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support import TIMEOUT_SCALE, dead, wait_for
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.prewarm import kernels, pagecache
from vllmwatch.prewarm import runner as prewarm
from vllmwatch.testing.driver import LogCapture

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".cache" / "vllm-venv" / "bin" / "python"
MIB = 1 << 20


Events = LogCapture


def make_config(model: Path | str, **prewarm_keys: Any) -> Config:
    vllm: dict[str, Any] = {"model": str(model)}
    if "gpus" in prewarm_keys:
        vllm["gpus"] = prewarm_keys.pop("gpus")
    if "env" in prewarm_keys:
        vllm["env"] = prewarm_keys.pop("env")
    return from_dict({"vllm": vllm, "prewarm": prewarm_keys})


def write_files(folder: Path, count: int, size: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    block = os.urandom(MIB)
    for i in range(count):
        path = folder / f"model-{i:05d}-of-{count:05d}.safetensors"
        with open(path, "wb") as fh:
            for _ in range(size // MIB):
                fh.write(block)
        paths.append(path)
    return paths


def step(report: prewarm.PrewarmReport, name: str) -> prewarm.StepResult:
    return next(s for s in report.steps if s.name == name)


NO_GPU = prewarm.Hooks(gpu_count=lambda: 0)


# --- cache placement ----------------------------------------------------------------------

def test_cache_env_places_every_cache_under_the_cache_dir(tmp_path: Path) -> None:
    config = make_config(tmp_path, cache_dir="/srv/cache")
    assert prewarm.cache_env(config, {}) == {
        "VLLM_CACHE_ROOT": "/srv/cache/vllm", "TRITON_CACHE_DIR": "/srv/cache/triton",
        "FLASHINFER_WORKSPACE_BASE": "/srv/cache/flashinfer",
        "HF_HOME": "/srv/cache/huggingface"}


def test_cache_env_never_overrides_what_the_user_set(tmp_path: Path) -> None:
    config = make_config(tmp_path, cache_dir="/c", env={"HF_HOME": "/models/hf"})
    env = prewarm.cache_env(config, {"TRITON_CACHE_DIR": "/mine/triton"})
    assert env == {"VLLM_CACHE_ROOT": "/c/vllm", "FLASHINFER_WORKSPACE_BASE": "/c/flashinfer"}


def test_child_env_layers_the_users_settings_over_ours(tmp_path: Path) -> None:
    config = make_config(tmp_path, cache_dir="/c", env={"HF_HOME": "/models/hf"})
    env = prewarm.child_env(config, {"TRITON_CACHE_DIR": "/mine/triton", "HOME": "/h"})
    assert env["HF_HOME"] == "/models/hf" and env["TRITON_CACHE_DIR"] == "/mine/triton"
    assert env["VLLM_CACHE_ROOT"] == "/c/vllm" and env["HOME"] == "/h"


def test_make_cache_dirs_keeps_only_usable_ones(tmp_path: Path) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache root should be")
    good = make_config(tmp_path, cache_dir=str(tmp_path / "cache"))
    usable, problems = prewarm.make_cache_dirs(good, {})
    assert set(usable) == set(prewarm.CACHE_VARS) and not problems
    assert all(os.path.isdir(p) for p in usable.values())
    bad = make_config(tmp_path, cache_dir=str(blocked))
    usable, problems = prewarm.make_cache_dirs(bad, {})
    assert usable == {} and {var for var, _, _ in problems} == set(prewarm.CACHE_VARS)


def test_cache_env_honours_systemd_cache_directory(tmp_path: Path) -> None:
    config = make_config(tmp_path, cache_dir="/c")
    env = prewarm.cache_env(config, {"CACHE_DIRECTORY": "/var/cache/vw:/var/cache/other"})
    assert env["VLLM_CACHE_ROOT"] == "/var/cache/vw/vllm"
    assert env["HF_HOME"] == "/var/cache/vw/huggingface"


def test_prewarm_disabled_means_no_env_and_no_steps(tmp_path: Path) -> None:
    config = make_config(tmp_path, enabled=False)
    assert prewarm.cache_env(config, {"HOME": "/root"}) == {}
    report = prewarm.run(config, Events(), {}, NO_GPU)
    assert report.ok
    assert [s.status for s in report.steps] == ["skipped"] * 3


def test_caches_step_creates_dirs_and_reports_sizes(tmp_path: Path) -> None:
    config = make_config(tmp_path / "nomodel", cache_dir=str(tmp_path / "cache"), kernels=False)
    compiled = tmp_path / "cache" / "vllm" / "torch_compile_cache" / "abc"
    compiled.mkdir(parents=True)
    (compiled / "graph.bin").write_bytes(b"x" * 100_000)
    report = prewarm.run(config, Events(), {}, NO_GPU)
    caches = step(report, "caches")
    assert caches.status == "ok", caches.detail
    for sub in ("vllm", "triton", "flashinfer", "huggingface"):
        assert (tmp_path / "cache" / sub).is_dir()
    assert (tmp_path / "cache" / "triton").stat().st_mode & 0o077 == 0
    sizes = caches.data["caches"]
    assert sizes["torch_compile"]["files"] == 1
    assert sizes["torch_compile"]["bytes"] >= 100_000
    assert sizes["flashinfer"]["path"] == str(tmp_path / "cache/flashinfer/.cache/flashinfer")
    # vLLM's start-up caches (issue 33): where they are, absent until a start writes them
    assert sizes["startup_plan"] == {"path": str(tmp_path / "cache/vllm/startup_plan"),
                                     "exists": False}
    assert sizes["aot_artifacts"]["path"].endswith("torch_compile_cache/torch_aot_compile")
    assert step(report, "page_cache").status == "skipped"


def test_cache_report_stops_at_its_time_limit(tmp_path: Path) -> None:
    config = make_config(tmp_path, cache_dir=str(tmp_path))
    (tmp_path / "vllm").mkdir()
    report = prewarm.cache_report(config, {}, time_limit=0.0)
    assert report["vllm"]["partial"] is True


# --- compile-cache hits --------------------------------------------------------------------

@pytest.mark.parametrize("line,hit", [
    ("(EngineCore_DP0 pid=2827) INFO 02-22 06:35:26 [backends.py:267] Directly load the "
     "compiled graph(s) for compile range (1, 2048) from the cache, took 1.908 s", True),
    ("(Worker_TP0 pid=57) INFO 06-21 07:20:13 [backends.py:292] Directly load the compiled "
     "graph(s) for compile range (1, 8192) from the cache, took 0.717 s", True),
    ("INFO [backends.py:161] Directly load the compiled graph(s) for dynamic shape from the "
     "cache, took 5.432 s", True),
    ("INFO [backends.py:165] Directly load the compiled graph(s) for shape 8 from the cache, "
     "took 0.1 s", True),
    ("(Worker_TP0 pid=57) INFO 06-21 07:20:13 [decorators.py:311] Directly load AOT "
     "compilation from path /cache/vllm/torch_compile_cache/torch_aot_compile/6e/model", True),
    ("(EngineCore_DP0 pid=94) INFO 03-09 12:57:29 [backends.py:913] Using cache directory: "
     "/root/.cache/vllm/torch_compile_cache/3a332b42ba/rank_0_0/backbone for vLLM's "
     "torch.compile", False),
    ("INFO [backends.py:215] Compiling a graph for compile range (1, 2048) takes 31.2 s", False),
    ("INFO [monitor.py:34] torch.compile takes 9.27 s in total", False),
    ("", False),
])
def test_compile_cache_hit_on_real_vllm_lines(line: str, hit: bool) -> None:
    assert prewarm.compile_cache_hit(line) is hit


# --- page cache ----------------------------------------------------------------------------

def test_page_cache_warms_evicted_weights(tmp_path: Path) -> None:
    files = write_files(tmp_path / "model", 3, 64 * MIB)
    pagecache.evict(files)
    before = pagecache.residency(files)
    if before is None:
        pytest.skip("mincore is not available here")
    events = Events()
    config = make_config(tmp_path / "model", cache_dir=str(tmp_path / "cache"),
                         page_cache_workers=3, kernels=False)
    report = prewarm.run(config, events, {}, prewarm.Hooks(gpu_count=lambda: 0,
                                                            progress_every=0.001))
    page = step(report, "page_cache")
    assert page.status == "ok", page.detail
    assert page.data["read_bytes"] == 3 * 64 * MIB
    assert page.data["resident_after"] >= 0.99
    progress = events.named("prewarm.page_cache.progress")
    assert all({"percent", "mib_per_s"} <= set(p) for p in progress)
    if before > 0.1:
        pytest.skip(f"the kernel kept {before:.0%} resident after POSIX_FADV_DONTNEED; "
                    "cannot show residency before warming was low")
    assert page.data["resident_before"] <= 0.1


def test_page_cache_skips_resident_weights(tmp_path: Path) -> None:
    files = write_files(tmp_path / "model", 2, 4 * MIB)
    for path in files:
        path.read_bytes()
    config = make_config(tmp_path / "model", cache_dir=str(tmp_path / "cache"), kernels=False)
    page = step(prewarm.run(config, Events(), {}, NO_GPU), "page_cache")
    assert page.status == "skipped"
    assert page.detail.startswith("already resident")


def test_page_cache_skips_weights_that_would_not_fit(tmp_path: Path) -> None:
    files = write_files(tmp_path / "model", 1, 8 * MIB)
    pagecache.evict(files)
    config = make_config(tmp_path / "model", cache_dir=str(tmp_path / "cache"), kernels=False,
                         page_cache_max_fraction=0.0)
    page = step(prewarm.run(config, Events(), {}, NO_GPU), "page_cache")
    if page.data.get("resident_before", 0) >= prewarm.RESIDENT_ENOUGH:
        pytest.skip("the kernel would not evict the file")
    assert page.status == "skipped"
    assert "page_cache_max_fraction" in page.detail


def test_page_cache_time_out_warns_within_the_bound(tmp_path: Path) -> None:
    files = write_files(tmp_path / "model", 3, 4 * MIB)
    pagecache.evict(files)
    release = threading.Event()

    def stuck_reader(fd: int, buf: bytearray, offset: int) -> int:
        release.wait(60)  # a read that hangs, like one on a dead network disk
        return 0

    config = make_config(tmp_path / "model", cache_dir=str(tmp_path / "cache"), kernels=False,
                         timeout=0.5)
    start = time.monotonic()
    try:
        report = prewarm.run(config, Events(), {}, prewarm.Hooks(
            gpu_count=lambda: 0, reader=stuck_reader))
    finally:
        release.set()
    elapsed = time.monotonic() - start
    page = step(report, "page_cache")
    if page.status == "skipped":
        pytest.skip(f"page cache step skipped: {page.detail}")
    assert page.status == "warn"
    assert "prewarm.timeout" in page.detail
    assert report.ok
    assert elapsed < 10.0  # the 0.5 s bound held: the stuck read alone would take 60 s


def test_slow_reader_stops_at_the_deadline_and_reports_progress(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = write_files(tmp_path, 2, 32 * MIB)
    events = Events()
    start = time.monotonic()
    deadline = start + 0.3

    def said() -> bool:
        return bool(events.named("prewarm.page_cache.progress"))

    def clock() -> float:
        # The warm's clock: real time, held short of the deadline until progress is said.
        # The warm says it at its first look (0.2 s in); a loaded box waking that look past a
        # real 0.3 s deadline said nothing (1 run in 60 beside two busy loops).
        return time.monotonic() if said() else min(time.monotonic(), deadline - 0.001)

    monkeypatch.setattr(pagecache, "time", SimpleNamespace(monotonic=clock))
    reads = itertools.count(1)  # (next() is one step under the GIL: two readers share it)

    def slow_reader(fd: int, buf: bytearray, offset: int) -> int:
        if next(reads) > 2:  # a first MiB per thread, then no more until progress is said, so
            wait_for(said, 10, "progress said")  # the clock held does not read it all
        time.sleep(0.01)  # simulates a slow disk: 1 MiB per 10 ms
        return os.preadv(fd, [memoryview(buf)[:MIB]], offset)

    result = pagecache.warm(files, 2, deadline, events, progress_every=0.05,
                            reader=slow_reader)
    assert not result.finished
    assert 0 < result.read_bytes < result.total_bytes
    assert time.monotonic() - start < 0.3 + 30  # a hang's bound, not a speed target
    assert events.named("prewarm.page_cache.progress")


def test_required_failure_makes_the_report_not_ok_and_exit_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    config = make_config(tmp_path / "nomodel", cache_dir=str(blocker / "cache"), required=True,
                         gpus=[])
    report = prewarm.run(config, Events(), {}, NO_GPU)
    assert not report.ok
    assert step(report, "caches").status == "failed"
    assert "prewarm.cache_dir" in step(report, "caches").detail
    assert prewarm.main(config, as_json=True) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False


def test_failure_without_required_is_a_warning_and_exit_0(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    config = make_config(tmp_path / "nomodel", cache_dir=str(blocker / "cache"), gpus=[])
    report = prewarm.run(config, Events(), {}, NO_GPU)
    assert report.ok
    assert step(report, "caches").status == "warn"
    assert prewarm.main(config) == 0


def test_weight_files_prefer_safetensors_and_follow_the_index(tmp_path: Path) -> None:
    for name in ("a.safetensors", "b.safetensors", "pytorch_model.bin", "x.safetensors"):
        (tmp_path / name).write_bytes(b"w")
    assert [p.name for p in pagecache.weight_files(tmp_path)] == [
        "a.safetensors", "b.safetensors", "x.safetensors"]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"l0": "a.safetensors", "l1": "b.safetensors"}}))
    assert [p.name for p in pagecache.weight_files(tmp_path)] == [
        "a.safetensors", "b.safetensors"]


def test_hub_id_resolves_to_the_downloaded_snapshot(tmp_path: Path) -> None:
    repo = tmp_path / "cache" / "huggingface" / "hub" / "models--Qwen--Qwen3-0.6B"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    config = make_config("Qwen/Qwen3-0.6B", cache_dir=str(tmp_path / "cache"))
    assert prewarm.model_dir(config, {}) == repo / "snapshots" / "abc123"


# --- kernels -------------------------------------------------------------------------------

def test_kernels_skip_without_a_gpu(tmp_path: Path) -> None:
    if kernels.gpu_count() > 0:
        pytest.skip("this machine has an NVIDIA GPU")
    config = make_config(tmp_path, cache_dir=str(tmp_path / "cache"), page_cache=False,
                         kernels=True)
    report = prewarm.run(config, Events(), {})
    assert step(report, "kernels").status == "skipped"
    assert step(report, "kernels").detail == "skipped: no GPU"


def test_kernels_skip_for_a_cpu_config_even_with_a_gpu(tmp_path: Path) -> None:
    config = make_config(tmp_path, cache_dir=str(tmp_path / "cache"), gpus=[], required=True,
                         kernels=True)
    report = prewarm.run(config, Events(), {}, prewarm.Hooks(gpu_count=lambda: 8))
    assert step(report, "kernels").detail == "skipped: no GPU"
    assert report.ok


def test_kernel_script_failure_is_a_warning(tmp_path: Path) -> None:
    config = make_config(tmp_path, cache_dir=str(tmp_path / "cache"), page_cache=False,
                         kernels=True)
    hooks = prewarm.Hooks(gpu_count=lambda: 1, python=sys.executable,
                          kernel_script="import sys; sys.exit('boom: no torch here')")
    k = step(prewarm.run(config, Events(), {}, hooks), "kernels")
    assert k.status == "warn"
    assert "boom: no torch here" in k.detail


def test_kernel_time_out_kills_the_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time\n"
              # a lifetime, not a wait: its owner kills it
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
              f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
              "time.sleep(600)\n")  # a lifetime, not a wait: its owner kills it
    config = make_config(tmp_path, cache_dir=str(tmp_path / "cache"), page_cache=False,
                         timeout=3, required=True, kernels=True)
    hooks = prewarm.Hooks(gpu_count=lambda: 1, python=sys.executable, kernel_script=script)
    start = time.monotonic()
    report = prewarm.run(config, Events(), {}, hooks)
    assert time.monotonic() - start < 3 + 6
    k = step(report, "kernels")
    assert k.status == "failed" and "timed out" in k.detail
    assert not report.ok
    grandchild = int(pidfile.read_text())
    wait_for(lambda: dead(grandchild), 5, f"grandchild {grandchild} to die with the time-out")


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no vLLM venv (scripts/setup_vllm.sh)")
def test_kernel_script_falls_back_to_sdpa_in_the_real_vllm_venv() -> None:
    spec = {"backend": "auto", "head_dim": 64, "num_heads": 2, "num_kv_heads": 1,
            "dtype": "bfloat16", "device": "cpu"}
    out = kernels.run_script(str(VLLM_PYTHON), spec, dict(os.environ), timeout=120 * TIMEOUT_SCALE)
    assert out.status == "ok", out.detail
    assert out.data["backend"] == "sdpa"
    assert "flash_attn" in out.data["tried"]


def test_model_shape_and_backend_from_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(
        {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
         "torch_dtype": "float16"}))
    shape = kernels.model_shape(tmp_path)
    assert (shape["head_dim"], shape["num_heads"], shape["num_kv_heads"], shape["dtype"]) == (
        128, 32, 8, "float16")
    (tmp_path / "config.json").write_text(json.dumps(
        {"text_config": {"head_dim": 256, "hidden_size": 2048, "num_attention_heads": 8,
                         "dtype": "bfloat16"}}))
    assert kernels.model_shape(tmp_path)["head_dim"] == 256
    assert kernels.model_shape(None)["from_config"] is False
    assert kernels.pick_backend({"VLLM_ATTENTION_BACKEND": "FLASHINFER"}, {}) == "flashinfer"
    assert kernels.pick_backend({}, {"attention-backend": "TRITON_ATTN"}) == "triton"
    assert kernels.pick_backend({}, {}) == "auto"
    assert kernels.args_dtype({"dtype": "half"}) == "float16"
    assert kernels.args_dtype({"dtype": "auto"}) is None


def _returns(fn: Any, seconds: float = 60.0) -> list[Any]:
    """fn() on a thread of its own: what it returned, [] when it is still blocked."""
    import threading

    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    t.join(seconds)  # a bound for a hang only: the reads answer at once
    return box


def test_a_fifo_where_a_small_model_file_is_never_blocks(tmp_path: Path) -> None:
    """A FIFO (or a hung mount) at refs/main or config.json blocked prewarm for good, and
    on unified memory the start guard's lookup froze the daemon's loop: these reads are
    capped and bounded now, and give up on anything but a regular file."""
    import os

    from vllmwatch.prewarm import kernels, pagecache

    repo = tmp_path / "hub" / "models--org--m"
    (repo / "snapshots" / "abc").mkdir(parents=True)
    (repo / "refs").mkdir()
    os.mkfifo(repo / "refs" / "main")
    model = tmp_path / "model"
    model.mkdir()
    os.mkfifo(model / "config.json")
    got = _returns(lambda: pagecache.hub_snapshot("org/m", tmp_path / "hub"))
    assert got == [repo / "snapshots" / "abc"]  # the newest snapshot instead
    shape = _returns(lambda: kernels.model_shape(model))
    assert shape and shape[0]["from_config"] is False


def test_weight_map_names_outside_the_model_directory_are_not_read(tmp_path: Path) -> None:
    import json

    from vllmwatch.prewarm import pagecache

    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "outside.safetensors").write_bytes(b"\0" * 64)
    (model / "a.safetensors").write_bytes(b"\0" * 64)
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "x": "a.safetensors", "y": "../outside.safetensors",
        "z": str(tmp_path / "outside.safetensors")}}))
    assert pagecache.weight_files(model) == [model / "a.safetensors"]


@pytest.mark.parametrize("as_json", [False, True])
def test_the_report_and_its_log_pass_the_redactor_with_control_characters_shown(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        as_json: bool) -> None:
    """`vllmwatch prewarm` printed its log lines and report raw: a step's detail (an
    exception's text, the kernel script's output) with ESC rewrote the operator's terminal,
    and a token in it was shown in clear."""
    token = "hf_" + "a1B2c3D4e5" * 3
    hostile = f"boom\x1b]0;pwned\x07 HF_TOKEN={token}\nsecond line"

    def run(config: Config, log: Any, environ: Any, hooks: Any) -> prewarm.PrewarmReport:
        log("warning", "prewarm.step", detail=hostile)
        return prewarm.PrewarmReport((prewarm.StepResult("kernels", "warn", hostile, 0.1),),
                                     True)

    monkeypatch.setattr(prewarm, "run", run)
    config = make_config(tmp_path / "nomodel", cache_dir=str(tmp_path / f"c {token}"), gpus=[])
    assert prewarm.main(config, as_json=as_json) == 0
    got = capsys.readouterr()
    assert "kernels" in got.out and "prewarm.step" in got.err, got
    for text in (got.out, got.err):
        assert token not in text and "\x1b" not in text and "\x07" not in text, text
    assert len(got.err.splitlines()) == 1  # one event, one line
    if as_json:
        assert json.loads(got.out)["steps"][0]["status"] == "warn"
    else:
        assert "\\x1b" in got.out and "boom" in got.out
