"""`vllmwatch check`: the checklist against generated model directories and a fake NVML."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support import TIMEOUT_SCALE, free_port
from vllmwatch.check import gpu as checks_gpu
from vllmwatch.check import maxlen as checks_maxlen
from vllmwatch.check import model as checks_model
from vllmwatch.check import runner as check
from vllmwatch.check.runner import FAIL, PASS, SKIP, WARN, CheckResult
from vllmwatch.core import exitcodes

REPO = Path(__file__).resolve().parents[2]
VLLM_VENV_PY = REPO / ".cache" / "vllm-venv" / "bin" / "python"
MAKE_TINY = REPO / "scripts" / "make_tiny_model.py"
BASE_ENV = {"PATH": os.environ.get("PATH", ""), "HOME": "/nonexistent-home"}


# --- helpers ---------------------------------------------------------------------------------

def safetensors_bytes(tensors: dict[str, int]) -> bytes:
    """A valid safetensors file: F32 1-D tensors of the given lengths, zeros as data."""
    header: dict[str, Any] = {}
    offset = 0
    for name, n in tensors.items():
        header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [offset, offset + 4 * n]}
        offset += 4 * n
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def write_sums(model: Path, names: list[str]) -> None:
    import hashlib

    lines = [f"{hashlib.sha256((model / n).read_bytes()).hexdigest()}  {n}" for n in names]
    (model / "sha256sums.txt").write_text("\n".join(lines) + "\n")


def make_model(path: Path, max_pos: int = 4096, **config: Any) -> Path:
    """A minimal model dir by hand: config.json, tokenizer.json, one safetensors, sums."""
    path.mkdir(parents=True)
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
           "max_position_embeddings": max_pos, **config}
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "tokenizer.json").write_text('{"version": "1.0"}')
    (path / "model.safetensors").write_bytes(safetensors_bytes({"w": 4}))
    write_sums(path, ["config.json", "tokenizer.json", "model.safetensors"])
    return path


def write_config(tmp: Path, model: Path | str, *, args: str = "", vllm: str = "",
                 extra: str = "", port: int | None = None) -> str:
    """A CPU config (gpus = []) whose command is this Python (found on PATH, no vLLM)."""
    text = f"""
[vllm]
model = "{model}"
command = ["{sys.executable}", "-m", "vllm"]
port = {port or free_port()}
gpus = []
{vllm}
# Its KV cache sized, as the real CPU tests run it: else vLLM's start-up memory check (and
# `check`'s, tests/shell/test_start_memory.py) would depend on this box's free memory.
[vllm.env]
VLLM_CPU_KVCACHE_SPACE = "1"
[vllm.args]
{args}
[prewarm]
cache_dir = "{tmp / 'cache'}"
{extra}
"""
    path = tmp / "vllmwatch.toml"
    path.write_text(text)
    return str(path)


def results(path: str, fast: bool = False, env: dict[str, str] | None = None,
            nvml: Callable[[], Any] | None = None) -> dict[str, CheckResult]:
    got = check.run(path, fast=fast, env=env or BASE_ENV, nvml=nvml)
    assert len({r.name for r in got}) == len(got), got
    return {r.name: r for r in got}


def statuses(res: dict[str, CheckResult]) -> dict[str, str]:
    return {name: r.status for name, r in res.items()}


# --- the real tiny model ---------------------------------------------------------------------

@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not VLLM_VENV_PY.exists() or not MAKE_TINY.exists():
        pytest.skip(f"needs {VLLM_VENV_PY} and {MAKE_TINY} (run scripts/setup_vllm.sh)")
    out = tmp_path_factory.mktemp("tiny") / "model"
    proc = subprocess.run([str(VLLM_VENV_PY), str(MAKE_TINY), str(out)], capture_output=True,
                          text=True, timeout=300 * TIMEOUT_SCALE, check=False)
    assert proc.returncode == 0, proc.stderr
    return out


def test_tiny_model_passes(tiny_model: Path, tmp_path: Path) -> None:
    res = results(write_config(tmp_path, tiny_model, args="max-model-len = 2048"))
    # The command is this test's Python, which has no vLLM to ask for its flags: WARN.
    assert res.pop("vllm.args").status == WARN
    assert all(r.status in (PASS, SKIP) for r in res.values()), res
    assert res["model.checksums"].status == PASS
    assert "4096" in res["max-model-len"].detail


def test_tiny_model_corrupted_weight_caught_by_checksum(tiny_model: Path,
                                                       tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size: only the checksum can catch it
    weights.write_bytes(bytes(data))
    res = results(write_config(tmp_path, model))
    assert res["model.weights"].status == PASS
    assert res["model.checksums"].status == FAIL
    assert "model.safetensors" in res["model.checksums"].detail
    assert "config.json" not in res["model.checksums"].detail


def test_tiny_model_max_model_len_too_large(tiny_model: Path, tmp_path: Path) -> None:
    res = results(write_config(tmp_path, tiny_model, args="max-model-len = 8192"), fast=True)
    r = res["max-model-len"]
    assert r.status == FAIL and "8192" in r.detail and "4096" in r.detail
    assert "hf-overrides" in r.detail


# --- a hand-made model dir -------------------------------------------------------------------

def test_handmade_model_all_pass_and_exit_0(tmp_path: Path) -> None:
    path = write_config(tmp_path, make_model(tmp_path / "m"))
    res = results(path)
    assert res.pop("fights").status in (PASS, SKIP)  # this box's own crontabs
    assert statuses(res) == {
        "config": PASS, "vllm": PASS, "model.config": PASS, "model.tokenizer": PASS,
        "model.weights": PASS, "model.checksums": PASS, "max-model-len": PASS, "port": PASS,
        "gpu": PASS, "prewarm.cache_dir": PASS, "status.listen": PASS, "vllm.args": WARN,
        "instances": PASS, "start memory": PASS, "start caches": PASS, "spare": PASS}
    assert "CPU config" in res["gpu"].detail
    out = io.StringIO()
    assert check.main(path, as_json=False, fast=False, out=out, err=io.StringIO()) == 0
    assert "PASS  model.weights" in out.getvalue()


def test_fast_skips_checksums(tmp_path: Path) -> None:
    res = results(write_config(tmp_path, make_model(tmp_path / "m")), fast=True)
    assert res["model.checksums"].status == SKIP and "--fast" in res["model.checksums"].detail


def test_corrupted_file_named_by_checksum(tmp_path: Path) -> None:
    model = make_model(tmp_path / "m")
    (model / "tokenizer.json").write_text('{"version": "2.0"}')
    res = results(write_config(tmp_path, model))
    assert res["model.checksums"].status == FAIL
    assert "tokenizer.json" in res["model.checksums"].detail
    assert "model.safetensors" not in res["model.checksums"].detail


def test_file_listed_in_sums_but_missing(tmp_path: Path) -> None:
    model = make_model(tmp_path / "m")
    with (model / "sha256sums.txt").open("a") as fh:
        fh.write("0" * 64 + "  model-00002.safetensors\n")
    res = results(write_config(tmp_path, model))
    assert res["model.checksums"].status == FAIL
    assert "missing: model-00002.safetensors" in res["model.checksums"].detail


@pytest.mark.parametrize("cut", [4, 30, 12])  # in the length, in the header, in the data
def test_truncated_safetensors_is_named(tmp_path: Path, cut: int) -> None:
    model = make_model(tmp_path / "m")
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: cut if cut != 12 else len(data) - cut])
    res = results(write_config(tmp_path, model), fast=True)
    r = res["model.weights"]
    assert r.status == FAIL and "model.safetensors is truncated" in r.detail


def test_missing_tokenizer(tmp_path: Path) -> None:
    model = make_model(tmp_path / "m")
    (model / "tokenizer.json").unlink()
    res = results(write_config(tmp_path, model), fast=True)
    assert res["model.tokenizer"].status == FAIL and "no tokenizer" in res[
        "model.tokenizer"].detail


def test_missing_config_and_weights(tmp_path: Path) -> None:
    model = make_model(tmp_path / "m")
    (model / "config.json").unlink()
    (model / "model.safetensors").unlink()
    res = results(write_config(tmp_path, model), fast=True)
    assert res["model.config"].status == FAIL
    assert res["model.weights"].status == FAIL
    assert res["max-model-len"].status == SKIP


def test_sharded_index_names_a_missing_shard(tmp_path: Path) -> None:
    model = make_model(tmp_path / "m")
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors",
                            "b": "model-00002-of-00002.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    res = results(write_config(tmp_path, model), fast=True)
    r = res["model.weights"]
    assert r.status == FAIL and "model-00002-of-00002.safetensors" in r.detail
    assert "model-00001" not in r.detail


# --- max-model-len ---------------------------------------------------------------------------

@pytest.mark.parametrize(("cfg", "limit"), [
    ({"max_position_embeddings": 4096}, 4096),
    ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}},
     16384),
    ({"max_position_embeddings": 131072, "rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, 131072),
    ({"max_position_embeddings": 8192, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     8192),
    ({"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "default"}}, 4096),
    ({"text_config": {"max_position_embeddings": 2048}}, 2048),
    ({"n_positions": 1024, "max_position_embeddings": 2048}, 1024),
])
def test_model_max_len(cfg: dict[str, Any], limit: int) -> None:
    found = checks_maxlen.model_max_len(cfg)
    assert found is not None and found[0] == limit


@pytest.mark.parametrize(("raw", "want"), [
    (4096, 4096), ("4096", 4096), ("32k", 32000), ("32K", 32768), ("1m", 10**6), (-1, None),
    ("auto", None)])
def test_parse_len(raw: object, want: int | None) -> None:
    assert checks_maxlen.parse_len(raw) == want


@pytest.mark.parametrize("raw", ["abc", "1e5", "0x2000", 0, True, [8192], "1.5K", "", -5])
def test_a_length_vllm_refuses_is_named_not_called_unset(raw: object) -> None:
    """check said "PASS not set; vLLM uses the model's 4096" for each of these."""
    with pytest.raises(ValueError, match="is not a length vLLM reads"):
        checks_maxlen.parse_len(raw)


def test_hf_overrides_rope_raise_the_limit(tmp_path: Path) -> None:
    args = ('max_model_len = 16384\n'
            'hf-overrides = { rope_parameters = { rope_type = "dynamic", factor = 4.0 } }')
    res = results(write_config(tmp_path, make_model(tmp_path / "m"), args=args), fast=True)
    assert res["max-model-len"].status == PASS and "16384" in res["max-model-len"].detail


@pytest.mark.parametrize("args", ['max-model-len = "abc"', 'max_model_len = 0',
                                  'max-model-len = "1e5"'])
def test_a_max_model_len_vllm_refuses_fails_the_check(tmp_path: Path, args: str) -> None:
    res = results(write_config(tmp_path, make_model(tmp_path / "m"), args=args), fast=True)
    row = res["max-model-len"]
    assert row.status == FAIL and "is not a length vLLM reads" in row.detail, row


def test_max_model_len_in_extra_args_and_allow_long(tmp_path: Path) -> None:
    path = write_config(tmp_path, make_model(tmp_path / "m"),
                        vllm='extra_args = ["--max-model-len=8k"]')
    assert results(path, fast=True)["max-model-len"].status == FAIL
    env = {**BASE_ENV, "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
    assert results(path, fast=True, env=env)["max-model-len"].status == WARN


# --- config, port, vllm, hub, cache ----------------------------------------------------------

def test_port_in_use_names_the_holder(tmp_path: Path) -> None:
    port = free_port()
    path = write_config(tmp_path, make_model(tmp_path / "m"), port=port)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        r = results(path, fast=True)["port"]
    assert r.status == FAIL and str(port) in r.detail
    assert f"pid {os.getpid()}" in r.detail or "not visible" in r.detail


def test_legacy_flag_fails_config_but_other_checks_run(tmp_path: Path) -> None:
    path = write_config(tmp_path, make_model(tmp_path / "m"), args='kv-cache-dtype = "fp16"')
    res = results(path, fast=True)
    assert res["config"].status == FAIL and "fp16" in res["config"].detail
    assert res["model.weights"].status == PASS
    assert check.main(path, as_json=False, fast=True, out=io.StringIO()) == exitcodes.CONFIG


def test_unreadable_api_key_file_fails_config(tmp_path: Path) -> None:
    path = write_config(tmp_path, make_model(tmp_path / "m"),
                        vllm=f'api_key_file = "{tmp_path / "nokey"}"')
    r = results(path, fast=True)["config"]
    assert r.status == FAIL and "api_key_file" in r.detail


def test_missing_vllm_executable(tmp_path: Path) -> None:
    path = write_config(tmp_path, make_model(tmp_path / "m"))
    Path(path).write_text(Path(path).read_text().replace(
        f'command = ["{sys.executable}", "-m", "vllm"]', 'command = ["no-such-vllm", "serve"]'))
    r = results(path, fast=True)["vllm"]
    assert r.status == FAIL and "no-such-vllm" in r.detail


def test_missing_local_path_fails_instead_of_download_warning(tmp_path: Path) -> None:
    r = results(write_config(tmp_path, tmp_path / "no-such-model"), fast=True)["model"]
    assert r.status == FAIL and "does not exist" in r.detail


def test_invalid_config_json_fails_once(tmp_path: Path) -> None:
    model = make_model(tmp_path / "m")
    (model / "config.json").write_text("{not json")
    res = results(write_config(tmp_path, model, args="max-model-len = 10"), fast=True)
    assert res["model.config"].status == FAIL and res["max-model-len"].status == SKIP


def test_hub_id_warn_cached_pass_offline_fail(tmp_path: Path) -> None:
    path = write_config(tmp_path, "org/name")
    env = {**BASE_ENV, "HF_HOME": str(tmp_path / "hf")}
    assert results(path, fast=True, env=env)["model"].status == WARN
    assert results(path, fast=True, env={**env, "HF_HUB_OFFLINE": "1"})["model"].status == FAIL
    repo = tmp_path / "hf" / "hub" / "models--org--name"
    make_model(repo / "snapshots" / "abc123", max_pos=1024)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    res = results(path, fast=True, env=env)
    assert res["model"].status == PASS and "abc123" in res["model"].detail
    assert "1024" in res["max-model-len"].detail


def test_cache_dir_not_writable_warns(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    path = write_config(tmp_path, make_model(tmp_path / "m"))
    Path(path).write_text(Path(path).read_text().replace(
        f'cache_dir = "{tmp_path / "cache"}"', f'cache_dir = "{blocker / "sub"}"'))
    assert results(path, fast=True)["prewarm.cache_dir"].status == WARN
    Path(path).write_text(Path(path).read_text() + "enabled = false\n")
    assert results(path, fast=True)["prewarm.cache_dir"].status == SKIP


def test_broken_config_is_one_fail_exit_78(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[vllm\nmodel = 1\n")
    assert [(r.name, r.status) for r in check.run(str(path))] == [("config", FAIL)]
    out = io.StringIO()
    assert check.main(str(path), as_json=True, fast=False, out=out) == exitcodes.CONFIG
    assert json.loads(out.getvalue())[0]["detail"].startswith(str(path))


def test_json_output_parses(tmp_path: Path) -> None:
    path = write_config(tmp_path, make_model(tmp_path / "m"), args="max-model-len = 9999")
    out = io.StringIO()
    assert check.main(path, as_json=True, fast=True, out=out) == 1
    items = json.loads(out.getvalue())
    assert all(set(i) == {"name", "status", "detail"} for i in items)
    assert {"name": "max-model-len", "status": FAIL}.items() <= next(
        i for i in items if i["name"] == "max-model-len").items()


def test_a_crashing_check_becomes_a_fail() -> None:
    def boom(ctx: check.Context) -> CheckResult:
        raise RuntimeError("kaput")

    [r] = check.run_one("boom", boom, None)  # type: ignore[arg-type]
    assert r.status == FAIL and "RuntimeError: kaput" in r.detail


def test_sha256_progress_for_big_files(tmp_path: Path) -> None:
    f = tmp_path / "big"
    f.write_bytes(bytes(1000))
    out = io.StringIO()
    checks_model.sha256_file(f, out, progress_min=0)
    assert "sha256 big: 100%" in out.getvalue()


def test_read_sums_gnu_and_bsd_styles(tmp_path: Path) -> None:
    a, b = "a" * 64, "B" * 64
    f = tmp_path / "SHA256SUMS"
    f.write_text(f"# comment\n{a}  x.safetensors\n{a} *bin mode.bin\nSHA256 (y.json) = {b}\n")
    assert checks_model.read_sums(f) == [(a, "x.safetensors"), (a, "bin mode.bin"),
                                         (b.lower(), "y.json")]


@pytest.mark.parametrize(("fifo", "check_name", "listed"), [
    ("model-00002-of-00002.safetensors", "model.weights", False),
    ("model.safetensors.index.json", "model.weights", False),
    ("sha256sums.txt", "model.checksums", False),
    ("SHA256SUMS", "model.checksums", False),
    ("extra.bin", "model.checksums", True),  # named in the sums file: hashing it would block
])
def test_a_fifo_in_the_model_dir_is_one_finding_never_a_hang(
        tmp_path: Path, fifo: str, check_name: str, listed: bool) -> None:
    model = make_model(tmp_path / "m")
    if fifo.lower() == "sha256sums.txt" or fifo == "SHA256SUMS":
        (model / "sha256sums.txt").unlink()
    os.mkfifo(model / fifo)  # nobody ever writes to it: a plain open() would block for good
    if listed:
        with (model / "sha256sums.txt").open("a") as fh:
            fh.write(f"{'0' * 64}  {fifo}\n")
    path = write_config(tmp_path, model)
    # a subprocess with a generous timeout: a regression fails here, never hangs the suite
    proc = subprocess.run([sys.executable, "-m", "vllmwatch", "--config", path, "check",
                           "--json"], capture_output=True, text=True, cwd=REPO,
                          timeout=120 * TIMEOUT_SCALE, check=False)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.returncode != 0, proc.stdout
    res = {r["name"]: r for r in json.loads(proc.stdout)}
    assert res[check_name]["status"] == FAIL, res[check_name]
    assert str(model / fifo) in res[check_name]["detail"], res[check_name]
    assert "FIFO" in res[check_name]["detail"] or "not a regular file" in \
        res[check_name]["detail"], res[check_name]


def test_cli_never_prints_a_traceback_for_broken_toml(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('[vllm]\nmodel = "x\n')
    proc = subprocess.run([sys.executable, "-m", "vllmwatch", "--config", str(path), "check"],
                          capture_output=True, text=True, cwd=REPO, timeout=60 * TIMEOUT_SCALE,
                          check=False)
    assert proc.returncode == exitcodes.CONFIG  # exit-codes.md: 78, as `run` exits
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout and "config" in proc.stdout


# --- GPUs through a fake NVML ----------------------------------------------------------------

class FakeNvml:
    """pynvml-shaped: gpus are dicts {name, total, used} (used None = NOT_SUPPORTED)."""

    NVML_ERROR_NOT_SUPPORTED = 3

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self, gpus: list[dict[str, Any]], procs: dict[int, list[Any]] | None = None,
                 init_error: int | None = None) -> None:
        self.gpus, self.procs, self.init_error = gpus, procs or {}, init_error
        self.shut = False

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.159"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return str(self.gpus[h]["name"]).encode()

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        if self.gpus[h]["used"] is None:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(total=self.gpus[h]["total"], used=self.gpus[h]["used"])

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return self.procs.get(h, [])


H200 = {"name": "NVIDIA H200", "total": 140 << 30, "used": 500 << 20}
GB10 = {"name": "NVIDIA GB10", "total": 0, "used": None}


def gpu(gpus: list[int] | None, nvml: Any) -> dict[str, CheckResult]:
    return {r.name: r for r in checks_gpu.check_gpus(gpus, lambda: nvml)}


def test_no_nvml_fails_a_gpu_config() -> None:
    assert gpu([0], None)["nvml"].status == FAIL
    res = gpu(None, FakeNvml([], init_error=12))
    assert res["nvml"].status == FAIL and "vllm.gpus = []" in res["nvml"].detail


def test_cpu_config_needs_no_nvml() -> None:
    def never() -> Any:
        raise AssertionError("NVML must not be touched for gpus = []")

    [r] = checks_gpu.check_gpus([], never)
    assert r.status == PASS and "CPU config" in r.detail


def test_healthy_gpus_pass_with_versions() -> None:
    nvml = FakeNvml([H200, H200])
    res = gpu(None, nvml)
    assert statuses(res) == {"nvml": PASS, "gpu 0": PASS, "gpu 1": PASS}
    assert "driver 580.159, CUDA 13.0" in res["nvml"].detail
    assert "NVIDIA H200" in res["gpu 1"].detail and nvml.shut


def test_unified_memory_not_supported_is_not_a_fail() -> None:
    proc = SimpleNamespace(pid=os.getpid(), usedGpuMemory=None)
    res = gpu([0], FakeNvml([GB10], procs={0: [proc]}))
    assert res["gpu 0"].status == PASS and "unified memory" in res["gpu 0"].detail
    assert FAIL not in statuses(res).values()


def test_memory_held_by_another_process_warns_with_pid_and_name() -> None:
    proc = SimpleNamespace(pid=os.getpid(), usedGpuMemory=70000 << 20)
    res = gpu([0], FakeNvml([{**H200, "used": 71000 << 20}], procs={0: [proc]}))
    r = res["gpu 0 processes"]
    assert r.status == WARN and f"pid {os.getpid()}" in r.detail and "70000 MiB" in r.detail
    assert "python" in r.detail.lower() and "vLLM may not fit" in r.detail


def test_memory_used_with_no_visible_process_warns() -> None:
    res = gpu([0], FakeNvml([{**H200, "used": 60000 << 20}]))
    assert res["gpu 0 processes"].status == WARN


def test_configured_gpu_missing_fails() -> None:
    res = gpu([0, 3], FakeNvml([H200, H200]))
    assert res["gpu 0"].status == PASS
    assert res["gpu 3"].status == FAIL and "NVML sees 2: 0-1" in res["gpu 3"].detail
    assert "NVML sees 1: 0)" in gpu([1], FakeNvml([H200]))["gpu 1"].detail


def test_gpu_config_through_run_uses_injected_nvml(tmp_path: Path) -> None:
    path = write_config(tmp_path, make_model(tmp_path / "m"))
    Path(path).write_text(Path(path).read_text().replace("gpus = []", "gpus = [1]"))
    res = results(path, fast=True, nvml=lambda: FakeNvml([H200]))
    assert res["gpu 1"].status == FAIL


def test_the_model_is_looked_for_in_the_cache_vllm_is_given(tmp_path: Path) -> None:
    """vLLM gets HF_HOME under the cache root (prewarm's cache variables); check looked in
    ~/.cache and FAILed a model cached where vLLM reads it (sudo -u vllmwatch vllmwatch
    check, container mode)."""
    path = write_config(tmp_path, "org/name")
    repo = tmp_path / "cache" / "huggingface" / "hub" / "models--org--name"
    make_model(repo / "snapshots" / "abc123", max_pos=1024)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    env = {**BASE_ENV, "HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    res = results(path, fast=True, env=env)
    assert res["model"].status == PASS and "abc123" in res["model"].detail, res["model"]


def test_the_cache_row_checks_the_directory_the_daemon_uses(tmp_path: Path) -> None:
    """Under systemd the daemon uses $CACHE_DIRECTORY, not prewarm.cache_dir."""
    real = tmp_path / "real"
    real.mkdir()
    path = write_config(tmp_path, make_model(tmp_path / "m"))
    r = results(path, fast=True, env={**BASE_ENV, "CACHE_DIRECTORY": str(real)})[
        "prewarm.cache_dir"]
    assert r.status == PASS and str(real) in r.detail, r


@pytest.mark.parametrize("written", ["models/m", "./models/m"])
def test_a_relative_model_is_not_judged_from_checks_own_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: str) -> None:
    """`check` run where the model is (a relative vllm.model) read its files and passed,
    while the service's vLLM, started in the unit's WorkingDirectory=, found no such folder
    and asked the hub for that name."""
    make_model(tmp_path / "models" / "m")
    monkeypatch.chdir(tmp_path)
    res = results(write_config(tmp_path, written), fast=True)
    assert res["model"].status == WARN, res["model"]
    assert "WorkingDirectory=" in res["model"].detail
    assert repr(str(tmp_path / "models" / "m")) in res["model"].detail
    assert "model.config" not in res and res["max-model-len"].status == SKIP


def test_a_model_under_a_tilde_is_refused_as_vllm_expands_none(tmp_path: Path) -> None:
    from vllmwatch.config.schema import ConfigError, load
    with pytest.raises(ConfigError, match=r"vllm\.model: bad value '~/m': vLLM does not expand"):
        load(write_config(tmp_path, "~/m"))


@pytest.mark.parametrize(("args", "extra", "key"), [
    ('chat-template = "./t.jinja"', "", "vllm.args.chat-template"),
    ("", 'extra_args = ["--lora-modules", "a=../adapters/a"]', "vllm.extra_args[1]"),
    # inside a JSON value, a table or JSON text: passed with no word, and vLLM compiled into
    # (or looked for its draft model in) a folder under its WorkingDirectory=
    ('compilation-config = { cache_dir = "./t.jinja" }', "",
     "vllm.args.compilation-config.cache_dir"),
    ('speculative-config = { model = "../adapters/d", num_speculative_tokens = 3 }', "",
     "vllm.args.speculative-config.model"),
    ("", """extra_args = ["--hf-overrides", '{"a": ["/x", "./t.jinja"]}']""",
     "vllm.extra_args[1].a[1]"),
])
def test_a_relative_path_for_vllm_is_a_warning_naming_its_key(
        tmp_path: Path, args: str, extra: str, key: str) -> None:
    """vLLM opens it from the unit's WorkingDirectory=, not from where the config was
    written: `check` passed it, and vLLM could not open the template at each start."""
    res = results(write_config(tmp_path, tmp_path / "m", args=args, vllm=extra), fast=True)
    row = res["relative paths"]
    assert row.status == WARN and key in row.detail and "WorkingDirectory=" in row.detail
    assert "t.jinja" not in row.detail and "adapters" not in row.detail  # keys, not values


def test_no_relative_path_no_row(tmp_path: Path) -> None:
    res = results(write_config(tmp_path, tmp_path / "m", args='chat-template = "/t.jinja"\n'
                               'speculative-config = { model = "org/draft" }'), fast=True)
    assert "relative paths" not in res
