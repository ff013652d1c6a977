"""Issue 23 §2: `print-command` refuses a flag that `run` refuses (the same text), instead of
printing a command that would not start."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from tests.support import TIMEOUT_SCALE
from vllmwatch import cli
from vllmwatch.config import vllminfo
from vllmwatch.core import exitcodes


@pytest.mark.parametrize("flag,rc", [("max-model-len", 0), ("max-modle-len", exitcodes.CONFIG)])
def test_print_command_refuses_what_run_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str], flag: str,
                                                rc: int) -> None:
    config = tmp_path / "v.toml"
    config.write_text(f'[vllm]\nmodel = "/m"\ncommand = ["{sys.executable}", "-m", "vllm"]\n'
                      f"[vllm.args]\n{flag} = 2048\n")
    cache = tmp_path / "cache"
    monkeypatch.setenv("CACHE_DIRECTORY", str(cache))
    monkeypatch.setattr(vllminfo, "version", lambda command: "0.99.0")
    # The flag list `run` would use, cached as `vllmwatch check` leaves it.
    key = hashlib.sha256(f"0.99.0\0{sys.executable}".encode()).hexdigest()[:16]
    folder = cache / f"vllm-flags-{os.geteuid()}"
    folder.mkdir(parents=True, mode=0o700, exist_ok=True)
    (folder / f"{key}.json").write_text(json.dumps({
        "version": "0.99.0", "flags": ["max-model-len"], "switches": [],
        "kinds": {"max-model-len": "number"}}))
    assert cli.main(["print-command", "-c", str(config)]) == rc
    out, err = capsys.readouterr()
    if rc:
        assert out == "" and "--max-modle-len is not a flag of vLLM 0.99.0" in err
        assert "did you mean max-model-len" in err
    else:
        assert "--max-model-len 2048" in out


def _config(tmp_path: Path, extra: str = "") -> Path:
    config = tmp_path / "v.toml"
    config.write_text(f'[vllm]\nmodel = "/m"\ncommand = ["{sys.executable}", "-m", "vllm"]\n'
                      f'[memory]\nunified = "false"\n{extra}')
    return config


def _vllm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, torch: str) -> None:
    from vllmwatch.config import startcaches

    monkeypatch.setenv("CACHE_DIRECTORY", str(tmp_path / "cache"))
    for name in (*startcaches.KNOWN, "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    info = startcaches.VllmInfo("0.99.0", torch, frozenset(startcaches.KNOWN))
    monkeypatch.setattr(vllminfo, "info", lambda command: info)
    monkeypatch.setattr(vllminfo, "version", lambda command: "0.99.0")


def test_print_command_carries_the_start_cache_variables_run_sets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The daemon's launch adds config/startcaches.py's variables (shell/versions.CacheEnv);
    a hand run without them compiles under another cache key and profiles in full."""
    _vllm(monkeypatch, tmp_path, "2.11.0")
    config = _config(tmp_path, "[prewarm]\nmega_aot_artifact = true\n")
    assert cli.main(["print-command", "-c", str(config)]) == exitcodes.OK
    out = capsys.readouterr().out
    for pair in ("VLLM_ENABLE_STARTUP_PLAN=1", "VLLM_USE_MEGA_AOT_ARTIFACT=1",
                 "VLLM_USE_STANDALONE_COMPILE=1"):
        assert pair in out


def test_print_command_refuses_what_run_refuses_for_the_start_caches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """VLLM_USE_STANDALONE_COMPILE=0 in the daemon's environment with torch >= 2.12 (vLLM's
    own artifact default): RealEffects.spawn refuses it (fatal); print-command printed it."""
    _vllm(monkeypatch, tmp_path, "2.12.0")
    monkeypatch.setenv("VLLM_USE_STANDALONE_COMPILE", "0")
    assert cli.main(["print-command", "-c", str(_config(tmp_path))]) == exitcodes.CONFIG
    out, err = capsys.readouterr()
    assert out == "" and "VLLM_USE_STANDALONE_COMPILE=0" in err


def test_print_command_says_what_it_cannot_reproduce(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The daemon's per-launch TMPDIR and the spare's lowered gpu-memory-utilization are not
    in the printed line: said on stderr, stdout stays one line to copy."""
    _vllm(monkeypatch, tmp_path, "2.11.0")
    config = _config(tmp_path, '[spare]\nenabled = "true"\n[gate]\nenabled = true\n'
                     'listen = "127.0.0.1:18999"\n')
    assert cli.main(["print-command", "-c", str(config)]) == exitcodes.OK
    out, err = capsys.readouterr()
    assert len(out.strip().splitlines()) == 1
    assert "TMPDIR" in err and "gpu-memory-utilization" in err
    # TMPDIR set in [vllm.env]: the daemon uses it, nothing to say about it.
    _config(tmp_path, '[vllm.env]\nTMPDIR = "/srv/tmp"\n')
    assert cli.main(["print-command", "-c", str(config)]) == exitcodes.OK
    out, err = capsys.readouterr()
    assert "TMPDIR=/srv/tmp" in out and "TMPDIR" not in err and "spare" not in err


def test_print_command_leaves_out_a_cache_dir_run_could_not_make(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`run` drops a cache variable whose directory it cannot make or write (vLLM would crash
    on it, prewarm.cache_unusable); the printed line drops it too, says so on stderr, and
    makes no directory itself."""
    _vllm(monkeypatch, tmp_path, "2.11.0")
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache dir's parent should be")
    monkeypatch.setenv("CACHE_DIRECTORY", str(blocked / "cache"))
    assert cli.main(["print-command", "-c", str(_config(tmp_path))]) == exitcodes.OK
    out, err = capsys.readouterr()
    assert "VLLM_CACHE_ROOT" not in out and "HF_HOME" not in out
    assert f"VLLM_CACHE_ROOT={blocked}/cache/vllm left out ({blocked} is not a directory)" in err
    assert "VLLM_ENABLE_STARTUP_PLAN=1" in out  # vLLM's own caches: under its default root
    # A directory that does not exist yet under a writable one: kept, and not made here.
    fresh = tmp_path / "fresh"
    monkeypatch.setenv("CACHE_DIRECTORY", str(fresh))
    assert cli.main(["print-command", "-c", str(_config(tmp_path))]) == exitcodes.OK
    out, err = capsys.readouterr()
    assert f"VLLM_CACHE_ROOT={fresh}/vllm" in out and "left out" not in err
    assert not fresh.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes any directory: no unwritable one")
def test_print_command_leaves_out_an_unwritable_cache_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _vllm(monkeypatch, tmp_path, "2.11.0")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    monkeypatch.setenv("CACHE_DIRECTORY", str(locked / "cache"))
    assert cli.main(["print-command", "-c", str(_config(tmp_path))]) == exitcodes.OK
    out, err = capsys.readouterr()
    assert "VLLM_CACHE_ROOT" not in out and f"({locked} is not writable)" in err


def test_a_dangling_cache_link_is_left_out_as_run_leaves_it_out(tmp_path: Path) -> None:
    """A cache dir that is a symlink to an unmounted disk: makedirs fails there (run's
    prewarm.cache_unusable), so the printed line must not carry it either."""
    from vllmwatch.prewarm.runner import cannot_make
    link = tmp_path / "cache"
    link.symlink_to(tmp_path / "unmounted" / "disk")
    assert cannot_make(str(link / "vllm")) == f"{link} is not a directory"
    assert cannot_make(str(tmp_path / "fresh" / "vllm")) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="drops to nobody: needs root")
def test_a_cache_dir_under_a_folder_nobody_may_search_is_a_reason_never_a_traceback() -> None:
    """`print-command` by a user who cannot search the cache dir's parent (a 0750 service
    home): a reason to leave the variable out, as `run` would, never a PermissionError."""
    import subprocess
    import tempfile
    home = tempfile.mkdtemp(prefix="vw-home-")  # under /tmp: nobody reaches it ...
    try:
        os.chmod(home, 0o750)  # ... but not into it
        code = ("import os, sys\nfrom vllmwatch.prewarm.runner import cannot_make\n"
                "os.setgid(65534); os.setuid(65534)\nprint(cannot_make(sys.argv[1]))\n")
        done = subprocess.run([sys.executable, "-c", code, os.path.join(home, "cache", "vllm")],
                              capture_output=True, text=True, timeout=60 * TIMEOUT_SCALE)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"{home} is not writable"
    finally:
        os.rmdir(home)


def test_the_left_out_note_passes_the_redactor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """stderr leaves too: a cache path that carries a URL's password is said redacted."""
    _vllm(monkeypatch, tmp_path, "2.11.0")
    blocked = tmp_path / "blocked"
    blocked.write_text("a file")
    monkeypatch.delenv("CACHE_DIRECTORY")  # prewarm.cache_dir decides, as in the config
    config = _config(tmp_path, f'[prewarm]\ncache_dir = "{blocked}/https://u:hunter2pass@h"\n')
    assert cli.main(["print-command", "-c", str(config)]) == exitcodes.OK
    err = capsys.readouterr().err
    assert "VLLM_CACHE_ROOT=" in err and "left out" in err and "hunter2pass" not in err


def test_print_command_hides_header_variables_and_the_check_does_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A header's value is the credential (`AUTHORIZATION_HEADER`), a list of headers carries
    them under names no rule knows (`OTEL_EXPORTER_OTLP_HEADERS`): both were printed in clear,
    and logged so in child.started, while init moved them out of the TOML as secrets."""
    _vllm(monkeypatch, tmp_path, "2.11.0")
    secrets = ("Basic dXNlcjpzM2NyM3Q=", "x-honeycomb-team=hc4ppk3y9")
    config = _config(tmp_path, f'[vllm.env]\nAUTHORIZATION_HEADER = "{secrets[0]}"\n'
                     f'OTEL_EXPORTER_OTLP_HEADERS = "{secrets[1]}"\n'
                     'CONTENT_TYPE_HEADER = "application/json"\n')
    assert cli.main(["print-command", "-c", str(config)]) == exitcodes.OK
    out, err = capsys.readouterr()
    assert "AUTHORIZATION_HEADER=" in out and "OTEL_EXPORTER_OTLP_HEADERS=" in out
    assert "CONTENT_TYPE_HEADER=application/json" in out
    for secret in (*secrets, "dXNlcjpzM2NyM3Q", "hc4ppk3y9"):
        assert secret not in out + err
