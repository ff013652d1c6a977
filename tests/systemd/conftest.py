"""Fixtures of the systemd tier: the built .deb, and a real systemd booted in systemd-nspawn.

`boot` runs a bash script as root inside a fresh container (the host's root, read-only, under
a tmpfs overlay) after installing the package; each boot is bounded and always torn down.
Without root or systemd-nspawn the container tests skip with the reason. The .deb is built
once per session with packaging/build-deb.sh, or taken from $VLLMWATCH_TEST_DEB.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from tests.systemd.harness import Bind, SystemdResult, run_in_systemd, unavailable_reason

REPO = Path(__file__).resolve().parents[2]
# Where the container sees the checkout's vllmwatch/ (read-only): the fakes come from there.
SOURCE_TREE = "/opt/vwtest/src"

# Bash functions every container script can use. `wait_for SECONDS CMD...` polls CMD with a
# deadline (never a bare sleep); `install_deb` installs the package under test.
PRELUDE = r"""
set -u
wait_for() {
    local deadline=$((SECONDS + $1)); shift
    until "$@"; do
        if [ "$SECONDS" -ge "$deadline" ]; then echo "TIMEOUT waiting for: $*"; return 1; fi
        sleep 0.2
    done
}
install_deb() {
    # The container's root is the host's under an overlay: a vllmwatch the host runs (its
    # /etc/vllmwatch, the package's dpkg record) would make this a conffile prompt or an
    # upgrade, not the fresh install each test asserts on. Gone here, in the overlay only.
    rm -rf /etc/vllmwatch
    dpkg --purge vllmwatch > /dev/null 2>&1 || true
    if ! DEBIAN_FRONTEND=noninteractive dpkg -i /vwdeb/vllmwatch.deb > dpkg.log 2>&1; then
        cat dpkg.log; exit 90
    fi
}
prop() { systemctl show -P "$2" "$1"; }
is_state() { [ "$(systemctl show -P ActiveState "$1")" = "$2" ]; }
readyz() { curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$1/readyz"; }
vllm_pids() { pgrep -f 'vllmwatch[.]testing[.]fake_vllm|VLLM::|vllm serve' \
    | sort -n | tr '\n' ' '; }
"""


# --exit-after 3 counted from the touch of this file (the script touches it once it saw
# child.ready), not from the fake's own ready: on a loaded box READY can come later than 3 s.
ARMED_EXIT: Mapping[str, object] = {"exit-after": 3, "arm-file": "/run/vllmwatch-faults.arm"}


def fake_config(port: int, status_port: int, startup_s: float = 1.0,
                extra_args: Mapping[str, object] | None = None, extra: str = "") -> str:
    """A vllmwatch config that supervises the fake vLLM of the source tree: the package does not
    ship vllmwatch/testing/, so `boot` binds the checkout's vllmwatch/ at SOURCE_TREE and the
    fake runs with it first on its PYTHONPATH (the daemon itself stays the installed one)."""
    args = {"startup-seconds": startup_s, **(extra_args or {})}
    arg_lines = "\n".join(f'{k} = {_toml(v)}' for k, v in args.items())
    return f"""\
[vllm]
model = "fake-model"
command = ["/opt/vllmwatch/venv/bin/python", "-m", "vllmwatch.testing.fake_vllm"]
port = {port}
gpus = []

[vllm.env]
PYTHONPATH = "{SOURCE_TREE}"

[vllm.args]
{arg_lines}

[probe]
interval = "1s"
timeout = "2s"
canary_interval = "3s"
canary_timeout = "5s"

[restart]
backoff_initial = "1s"
drain_timeout = "2s"
stop_timeout = "5s"

[prewarm]
enabled = false

[status]
listen = "127.0.0.1:{status_port}"
{extra}"""


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def dropin(**settings: object) -> str:
    """A [Service] drop-in, e.g. dropin(WatchdogSec="3s", RestartSec="1s")."""
    return "[Service]\n" + "".join(f"{k}={v}\n" for k, v in settings.items())


@pytest.fixture(scope="session")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package under test: $VLLMWATCH_TEST_DEB, or built now from the repo."""
    given = os.environ.get("VLLMWATCH_TEST_DEB")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("deb")
    env = {**os.environ, "VLLMWATCH_DEB_OUT": str(out),
           "VLLMWATCH_DEB_BUILD": str(tmp_path_factory.mktemp("deb-build"))}
    proc = subprocess.run([str(REPO / "packaging" / "build-deb.sh")], env=env, text=True,
                          capture_output=True, timeout=900)
    assert proc.returncode == 0, f"build-deb.sh failed:\n{proc.stdout}\n{proc.stderr}"
    debs = sorted(out.glob("vllmwatch_*.deb"))
    assert len(debs) == 1, debs
    return debs[0]


Boot = Callable[..., SystemdResult]


@pytest.fixture
def boot(request: pytest.FixtureRequest, tmp_path: Path) -> Boot:
    """boot(script, units=None, timeout=120, install=True) -> SystemdResult, in a container."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    deb: Path = request.getfixturevalue("deb")  # built only when a container can boot
    debdir = tmp_path / "debdir"
    debdir.mkdir()
    shutil.copy(deb, debdir / "vllmwatch.deb")

    boots = iter(range(1000))

    def run(script: str, units: Mapping[str, str] | None = None, timeout: float = 120.0,
            install: bool = True, binds: tuple[Bind, ...] = ()) -> SystemdResult:
        body = PRELUDE + ("install_deb\n" if install else "") + script
        source = Bind(str(REPO / "vllmwatch"), f"{SOURCE_TREE}/vllmwatch")
        return run_in_systemd(body, units, binds=(Bind(str(debdir), "/vwdeb"), source, *binds),
                              timeout=timeout, out_dir=tmp_path / f"out{next(boots)}")

    return run
