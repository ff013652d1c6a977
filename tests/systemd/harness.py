"""Boot a real systemd (the host's own, 252 on Debian 12) as PID 1 in systemd-nspawn for a test.

The host's root is bind-mounted read-only on a scratch folder and booted with
`--volatile=overlay`, so the container sees the host's files with a throw-away tmpfs on top:
`dpkg -i`, units written to /etc and everything else a test does vanish at power-off.

A oneshot driver unit runs the test's bash script after boot, with `/vwout` (a writable
host folder) as its working directory, then powers the container off with the script's exit
status (`SuccessAction=exit`/`FailureAction=exit` propagate it to systemd-nspawn). Every boot
is bounded by a deadline and always torn down: on timeout systemd-nspawn gets SIGTERM (an
orderly power-off of the container), then SIGKILL; the read-only bind is always unmounted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

STAGE = "/vwtest"  # read-only in the container: units, script, driver
OUT = "/vwout"  # writable in the container: results
DRIVER = "vwtest-driver.service"

_DRIVER_UNIT = f"""\
[Unit]
Description=vllmwatch systemd test driver
SuccessAction=exit
FailureAction=exit

[Service]
Type=oneshot
WorkingDirectory={OUT}
StandardOutput=file:{OUT}/script.log
StandardError=inherit
Environment=PATH=/opt/vllmwatch/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ExecStart=/bin/bash {STAGE}/driver.sh
TimeoutStartSec=infinity
"""

# Installs the test's units, runs its script, records the exit status; never fails itself
# before the script ran, so that a broken unit shows up in script.log, not as a silent boot.
_DRIVER_SH = f"""\
set -u
mkdir -p /etc/systemd/system
if [ -d {STAGE}/units ]; then cp -r {STAGE}/units/. /etc/systemd/system/; fi
systemctl daemon-reload
bash -x {STAGE}/script.sh
rc=$?
echo "$rc" > {OUT}/rc
journalctl --no-pager -o short-monotonic > {OUT}/journal.txt 2>&1
exit "$rc"
"""


class SystemdUnavailable(Exception):
    """This machine cannot boot a systemd container; the message says why (a skip reason)."""


@dataclass(frozen=True)
class Bind:
    """A host path made visible in the container."""

    host: str
    container: str
    read_only: bool = True

    def option(self) -> str:
        """The systemd-nspawn option for this bind."""
        flag = "--bind-ro" if self.read_only else "--bind"
        return f"{flag}={self.host}:{self.container}"


@dataclass(frozen=True)
class SystemdResult:
    """What a boot left behind."""

    returncode: int  # the script's exit status (nspawn's exit code; -1 when timed out)
    timed_out: bool
    out_dir: Path  # the container's /vwout: script.log, journal.txt, rc, anything the script wrote
    console: str  # systemd-nspawn's own output (boot and shutdown messages)
    seconds: float

    def read(self, name: str) -> str:
        """A file the script wrote under /vwout ('' when missing)."""
        path = self.out_dir / name
        return path.read_text(errors="replace") if path.exists() else ""

    @property
    def log(self) -> str:
        """The script's stdout and its `bash -x` trace."""
        return self.read("script.log")

    @property
    def journal(self) -> str:
        """The container's whole journal, collected at the end of the script."""
        return self.read("journal.txt")

    def explain(self) -> str:
        """A failure message with the useful tails."""
        return (f"rc={self.returncode} timed_out={self.timed_out} in {self.seconds:.1f}s\n"
                f"--- script.log (tail) ---\n{self.log[-6000:]}\n"
                f"--- journal (tail) ---\n{self.journal[-8000:]}\n"
                f"--- console (tail) ---\n{self.console[-2000:]}")


def unavailable_reason() -> str | None:
    """Why a container cannot be booted here, or None when it can."""
    if os.geteuid() != 0:
        return "booting systemd in systemd-nspawn needs root"
    if shutil.which("systemd-nspawn") is None:
        return "systemd-nspawn is not installed (apt-get install systemd-container)"
    if not Path("/lib/systemd/systemd").exists() and not Path("/usr/lib/systemd/systemd").exists():
        return "no systemd binary to boot (/lib/systemd/systemd)"
    return None


@contextlib.contextmanager
def _readonly_root(scratch: Path) -> Iterator[Path]:
    """Bind-mount / read-only on scratch/root for the life of the block."""
    root = scratch / "root"
    root.mkdir()
    subprocess.run(["mount", "--bind", "/", str(root)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(root)], check=True)
        yield root
    finally:
        if subprocess.run(["umount", str(root)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(root)], check=False)


def _stage(stage: Path, script: str, units: Mapping[str, str]) -> None:
    (stage / "units").mkdir(parents=True)
    for name, text in units.items():
        path = stage / "units" / name  # "x.service.d/override.conf" makes a drop-in
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (stage / "script.sh").write_text(script)
    (stage / "driver.sh").write_text(_DRIVER_SH)
    (stage / DRIVER).write_text(_DRIVER_UNIT)


def _stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM systemd-nspawn (the container powers off), then SIGKILL its group."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def run_in_systemd(script: str, units: Mapping[str, str] | None = None,
                   binds: Sequence[Bind] = (), timeout: float = 120.0,
                   out_dir: Path | None = None) -> SystemdResult:
    """Boot systemd in a throw-away container, run `script` (bash) as root in it, power off.

    `units` maps a name under /etc/systemd/system (e.g. "x.service" or
    "x.service.d/override.conf") to its text; they are installed and `daemon-reload`ed before
    the script runs. `binds` add host paths. The script's working directory is the
    writable /vwout, which is `out_dir` on the host (a fresh temporary folder by default).
    """
    reason = unavailable_reason()
    if reason:
        raise SystemdUnavailable(reason)
    out = Path(out_dir or tempfile.mkdtemp(prefix="vwtest-out-"))
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vwtest-") as tmp:
        scratch = Path(tmp)
        stage = scratch / "stage"
        _stage(stage, script, units or {})
        with _readonly_root(scratch) as root:
            cmd = ["systemd-nspawn", "-D", str(root), "--volatile=overlay", "--register=no",
                   "--keep-unit", "--link-journal=no", "--console=pipe", "--quiet",
                   # Loopback only: ports in tests cannot clash with the host or each other.
                   "--private-network",
                   f"--bind-ro={stage}:{STAGE}", f"--bind={out}:{OUT}",
                   f"--bind-ro={stage / DRIVER}:/etc/systemd/system/{DRIVER}",
                   *(b.option() for b in binds),
                   "--boot", f"systemd.wants={DRIVER}"]
            return _boot(cmd, out, timeout)


def _boot(cmd: list[str], out: Path, timeout: float) -> SystemdResult:
    start = time.monotonic()
    console_path = out / "console.txt"
    with console_path.open("wb") as console:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=console,
                                stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(proc, grace=20.0)
        finally:
            if proc.poll() is None:  # an exception (e.g. KeyboardInterrupt) in wait()
                _stop(proc, grace=5.0)
    return SystemdResult(returncode=-1 if timed_out else proc.returncode, timed_out=timed_out,
                         out_dir=out, console=console_path.read_text(errors="replace"),
                         seconds=time.monotonic() - start)
