"""`--config ""` is refused, never read as "no --config".

The units run `vllmwatch run --config ${VLLMWATCH_CONFIG}`: a drop-in that set the variable to
nothing gave every command an empty --config, which fell back to $VLLMWATCH_CONFIG (empty too)
and the default /etc/vllmwatch/vllmwatch.toml, so an instance ran, checked and reloaded another
instance's config. Now each command says what is wrong and exits as for a bad config (78; 2 for
`status`, whose bad configs are usage errors).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import TIMEOUT_SCALE
from vllmwatch.core import exitcodes

COMMANDS = [(["run"], exitcodes.CONFIG), (["check", "--fast"], exitcodes.CONFIG),
            (["check", "--config-only"], exitcodes.CONFIG),
            (["print-command"], exitcodes.CONFIG), (["prewarm"], exitcodes.CONFIG),
            (["incidents"], exitcodes.CONFIG), (["status"], 2)]


@pytest.mark.parametrize("empty", ["", " ", "\t"])
@pytest.mark.parametrize(("command", "code"), COMMANDS)
def test_an_empty_config_path_is_refused_by_every_command(
        tmp_path: Path, command: list[str], code: int, empty: str) -> None:
    good = tmp_path / "default.toml"  # what the fallback would have read: a config that runs
    good.write_text('[vllm]\nmodel = "org/m"\ngpus = []\n')
    env = {**os.environ, "VLLMWATCH_CONFIG": str(good)}
    done = subprocess.run([sys.executable, "-m", "vllmwatch", *command, "--config", empty],
                          capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=60 * TIMEOUT_SCALE)
    assert done.returncode == code, done
    assert "--config: an empty path" in done.stderr and "Traceback" not in done.stderr, done
    assert str(good) not in done.stdout + done.stderr, done
