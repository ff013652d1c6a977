"""`pip install -U vllm` under a running daemon (core/launchfail.py): the console script is
renamed away for a moment while the engine dies. The launch that cannot exec is of the very
command that reached READY: retried with backoff, READY again once the script is back. It
was exit 78, which the units never restart: the service stayed down after an upgrade."""

from __future__ import annotations

from pathlib import Path

from tests.support import PYTHON, Daemon, base_config, free_port, merge
from vllmwatch.core import launchfail


def _script(path: Path) -> Path:
    """vLLM's console script, as pip writes it: the fake vLLM under its interpreter."""
    path.write_text(f"#!{PYTHON}\nimport sys\nfrom vllmwatch.testing.fake_vllm import main\n"
                    "if __name__ == '__main__':\n    sys.exit(main())\n")
    path.chmod(0o755)
    return path


def test_the_console_script_renamed_away_after_ready_is_retried_until_it_is_back(
        tmp_path: Path) -> None:
    script = _script(tmp_path / "vllm")
    cfg = merge(base_config(free_port(), free_port(), ["--exit-after", "1"]),
                {"vllm": {"command": [str(script), "--startup-seconds", "0.3"]},
                 "restart": {"max_restarts": 20}})  # (the guard's own end: the core tests)
    workdir = tmp_path / "d"
    workdir.mkdir()
    d = Daemon(workdir, cfg, armed=True).start()
    try:
        d.wait_ready(30)
        moved = script.rename(tmp_path / "vllm.old")  # the upgrade is under way
        since, _ = d.arm()  # the engine dies 1 s from now: a crash restart
        for n in (1, 2):  # retried, with the backoff between
            failed = d.wait_event("child.spawn_failed", 30, since)
            since = d.index(failed) + 1
            assert failed["retry"] == launchfail.RAN_BEFORE, failed
            assert d.running(), f"exited after spawn failure {n}: " + d.dump()
        moved.rename(script)  # the upgrade finished
        d.wait_ready(30, since)
        assert d.named("daemon.exiting") == [], d.dump()
        assert [b["reason"] for b in d.named("restart.begin")][:3] == ["crash"] * 3
    finally:
        d.close()
