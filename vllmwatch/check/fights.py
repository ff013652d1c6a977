"""What fights the service: the pieces of a hand-run vLLM that keep running beside vllmwatch.

A cron job that `pkill -f "vllm serve"`s past a memory figure kills the vLLM vllmwatch
supervises (which then reports a crash no one understands); a hand-written unit or a
supervisord program starts a second vLLM on the same GPUs; a `nohup vllm serve` still holds
them. Each is a WARN naming the file and line or the pid, and what to do. Read-only. Every
scanner takes a root directory (and /proc a directory) so that tests plant files under a
temporary one. Reading other users' crontabs and processes needs root: the service user
(ProtectProc=invisible) is told once that it could not look.

Every file is read from outside (any local user can plant ~/.config/systemd/user units, and
this runs as `ExecStartPre=-vllmwatch check --fast`): only a regular file (a FIFO or device
is skipped without blocking), at most MAX_SCANNED bytes, each read within READ_TIMEOUT and
the whole scan within SCAN_TIMEOUT. A file that cannot be read (a dangling or looping link
after a package removal, a FIFO, a huge file) is one WARN naming it; the rest is still
scanned and reported.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import time
from dataclasses import dataclass, field

from vllmwatch.check.base import PASS, SKIP, WARN, CheckResult, Context
from vllmwatch.config import safefile
from vllmwatch.config.redact import REDACT
from vllmwatch.config.serveline import is_vllm_serve, shown
from vllmwatch.core import exitcodes

MAX_SCANNED = 1 << 20  # bytes of one unit, crontab or script (real ones are a few KiB)
READ_TIMEOUT = 2.0  # s for one file (a hung network mount blocks a read in the kernel)
SCAN_TIMEOUT = 10.0  # s for every file of the scan together; the rest is said, not read
MAX_PROC_FILE = 4 << 20  # bytes of one /proc/PID/cmdline or environ (ARG_MAX is 2 MiB)

_KILL = re.compile(r"\b(pkill|killall|kill)\b[^|;&]*vllm|\bsystemctl\s+(restart|stop|kill)\s+"
                   r"\S*vllm|\b(pkill|killall|kill)\b", re.I)
_GPU_QUERY = re.compile(r"nvidia-smi", re.I)
_RUNS = re.compile(r"\bvllm(\s+serve\b|\.entrypoints)", re.I)
_CRON_FILES = ("etc/crontab", "etc/cron.d/*", "var/spool/cron/crontabs/*", "var/spool/cron/*",
               "etc/cron.hourly/*", "etc/cron.daily/*")
_UNIT_DIRS = ("etc/systemd/system", "usr/local/lib/systemd/system", "lib/systemd/system",
              "usr/lib/systemd/system", "home/*/.config/systemd/user", "root/.config/systemd/user")
_SUPERVISOR = ("etc/supervisord.conf", "etc/supervisor/supervisord.conf",
               "etc/supervisor/conf.d/*", "etc/supervisord.d/*")


# What replaces a cron job that kills vLLM past an nvidia-smi memory figure (issue 36.7).
MEMORY_RULES = (
    "vllmwatch's [memory] rules replace it, watching only vLLM's tree and draining before the "
    "restart: read the tree's figure when healthy (`vllmwatch status`), then set "
    "memory.gpu_limit about 10% above it, memory.gpu_growth_limit = \"4GiB\" and "
    "memory.gpu_growth_rate = \"200MiB/h\" (memory.host_limit for a CPU deployment); on a "
    "DGX Spark the old figure was system memory (page cache and other tenants included), "
    "not vLLM's: do not copy it")


@dataclass(frozen=True)
class Finding:
    """One thing that fights the service, and what to do about it."""

    where: str  # file:line or pid N
    what: str
    todo: str


@dataclass
class Scan:
    """One scan's deadline, and the files it could not read (said, never fatal)."""

    root: str
    deadline: float = field(default_factory=lambda: time.monotonic() + SCAN_TIMEOUT)
    denied: list[str] = field(default_factory=list)  # not ours to read (not root)
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    late: list[str] = field(default_factory=list)  # not read: the scan's time was up

    def lines(self, path: str) -> list[tuple[int, str]]:
        """The non-comment lines of a file, numbered; [] for one that cannot be read."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.late.append(_shown(self.root, path))
            return []
        try:
            raw = safefile.read_within(path, MAX_SCANNED, min(READ_TIMEOUT, left))
        except safefile.FileProblem as exc:
            self._cannot(path, exc)
            return []
        out = []
        for number, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
            text = line.strip()
            if text and not text.startswith(("#", ";")):
                out.append((number, text))
        return out

    def _cannot(self, path: str, exc: safefile.FileProblem) -> None:
        where = _shown(self.root, path)
        try:
            os.stat(path)
        except OSError as err:
            if os.path.islink(path):
                why = ("a symbolic link loop" if err.errno == errno.ELOOP else
                       f"a dangling symbolic link (to {os.readlink(path)})")
                self.unreadable.append((where, why))
                return
        if os.geteuid() != 0 and not os.access(path, os.R_OK) and os.path.exists(path):
            self.denied.append(where)  # another user's: `sudo vllmwatch check` looks
            return
        self.unreadable.append((where, str(exc).replace(repr(path), "").strip(": ")))


def _verdict(text: str) -> str | None:
    """What a command line does to vLLM, with the words that say it; None if nothing."""
    kill = _KILL.search(text)
    # A bare kill counts only when the line asks nvidia-smi first (the guide's memory rule).
    if kill and (kill.group(0).lower().endswith("vllm") or _GPU_QUERY.search(text)):
        return f"kills or restarts vLLM ({_excerpt(text, kill)})"
    runs = _RUNS.search(text)
    if runs:
        return f"starts vLLM ({_excerpt(text, runs)})"
    return None


def _excerpt(text: str, match: re.Match[str]) -> str:
    start, end = max(0, match.start() - 20), min(len(text), match.end() + 40)
    return ("..." if start else "") + text[start:end] + ("..." if end < len(text) else "")


def _files(root: str, patterns: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for pattern in patterns:
        # Not isfile: a dangling link or a FIFO is said by Scan.lines, never skipped unseen.
        out += sorted(p for p in glob.glob(os.path.join(root, pattern)) if not os.path.isdir(p))
    return list(dict.fromkeys(out))


def _shown(root: str, path: str) -> str:
    return "/" + os.path.relpath(path, root) if root != "/" else path


def crontabs(root: str, scan: Scan) -> list[Finding]:
    """Cron lines (and the scripts they run) that kill, restart or start vLLM."""
    out = []
    for spool in ("var/spool/cron/crontabs", "var/spool/cron"):
        directory = os.path.join(root, spool)
        if os.path.isdir(directory) and not os.access(directory, os.R_OK | os.X_OK):
            scan.denied.append(_shown(root, directory))  # users' crontabs: root only
    for path in _files(root, _CRON_FILES):
        user_tab = "/var/spool/cron" in path
        todo = (f"crontab -e -u {os.path.basename(path)}" if user_tab else
                f"delete the line from {_shown(root, path)}")
        for number, text in scan.lines(path):
            out += _cron_line(scan, path, number, text, todo)
    return out


def _cron_line(scan: Scan, path: str, number: int, text: str, todo: str) -> list[Finding]:
    root = scan.root
    where = f"{_shown(root, path)}:{number}"
    verdict = _verdict(text)
    if verdict is not None:
        if verdict.startswith("kills") and _GPU_QUERY.search(text):
            todo += f"; {MEMORY_RULES}"
        return [Finding(where, f"{verdict}: {REDACT.head(text, 120)}", todo)]
    for word in text.split():  # a script the line runs: one level deep
        script = os.path.join(root, word.lstrip("/")) if word.startswith("/") else ""
        if script and os.path.isfile(script):
            for n, line in scan.lines(script):
                found = _verdict(line)
                if found is not None:
                    return [Finding(where, f"runs {word}, which {found} at its line {n}",
                                    todo)]
    return []


def units(root: str, scan: Scan) -> list[Finding]:
    """Units other than vllmwatch's whose commands run or kill vLLM."""
    out = []
    seen: set[str] = set()
    for directory in _UNIT_DIRS:
        for path in sorted(glob.glob(os.path.join(root, directory, "*.service"))):
            name = os.path.basename(path)
            real = os.path.realpath(path)
            if name.startswith("vllmwatch") or real in seen or real == "/dev/null":
                continue
            seen.add(real)
            out += _unit(root, path, name, scan)
    return out


def _unit(root: str, path: str, name: str, scan: Scan) -> list[Finding]:
    timer = os.path.join(os.path.dirname(path), name.removesuffix(".service") + ".timer")
    stop = name.removesuffix(".service") + (".timer" if os.path.lexists(timer) else "")
    for number, text in scan.lines(path):
        if not text.startswith("Exec"):
            continue
        verdict = _verdict(text.partition("=")[2])
        if verdict is not None:
            return [Finding(f"{_shown(root, path)}:{number}", f"{name}: {verdict}",
                            f"systemctl disable --now {stop}")]
    return []


def supervisors(root: str, scan: Scan) -> list[Finding]:
    """supervisord programs that run vLLM."""
    out = []
    for path in _files(root, _SUPERVISOR):
        program = ""
        for number, text in scan.lines(path):
            if text.startswith("[program:"):
                program = text[len("[program:"):].rstrip("]")
            elif text.startswith("command") and _verdict(text.partition("=")[2]):
                out.append(Finding(f"{_shown(root, path)}:{number}",
                                   f"supervisord program {program!r} runs vLLM "
                                   f"({REDACT.head(text, 80)})",
                                   f"supervisorctl stop {program} and "
                                   f"delete its section from {_shown(root, path)}"))
    return out


def processes(proc: str, gpus: list[int] | None, marker: str,
              start: str = "systemctl start vllmwatch") -> tuple[list[Finding], bool]:
    """`vllm serve` processes not started by a vllmwatch, on our GPUs; (found, all visible).
    `start`: the command that starts the vllmwatch the config is for."""
    out = []
    for entry in sorted(glob.glob(os.path.join(proc, "[0-9]*")), key=lambda p: len(p)):
        pid = int(os.path.basename(entry))
        argv = _read0(os.path.join(entry, "cmdline"))
        if not argv or pid == os.getpid() or not is_vllm_serve(argv):
            continue
        env = dict(w.partition("=")[::2] for w in _read0(os.path.join(entry, "environ")))
        if marker in env:
            continue  # supervised by a vllmwatch (this one or another: `instances` says)
        shared = _shared_gpus(gpus, env.get("CUDA_VISIBLE_DEVICES"))
        if shared:
            out.append(Finding(f"pid {pid}", f"a vLLM not started by vllmwatch runs on "
                               f"{shared}: {shown(REDACT.argv(argv))}",
                               f"stop it (kill {pid}) before `{start}`, "
                               "and remove what starts it"))
    visible = os.geteuid() == 0 or os.path.exists(os.path.join(proc, "1", "cmdline"))
    return out, visible


def _read0(path: str) -> list[str]:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_PROC_FILE)
    except OSError:
        return []
    return [w.decode("utf-8", "replace") for w in raw.split(b"\0") if w]


def _shared_gpus(ours: list[int] | None, theirs: str | None) -> str:
    """Which of our GPUs the other process may use; '' for none. Unset means every GPU."""
    if ours == []:
        return ""
    if theirs is None:
        return "every GPU (no CUDA_VISIBLE_DEVICES)" if ours is None else \
            f"GPU {', '.join(map(str, ours))} (it sees every GPU)"
    parts = {p.strip() for p in theirs.split(",") if p.strip()}
    if ours is None:
        return f"GPU {theirs}" if parts else ""
    if any(not (p.isascii() and p.isdigit()) for p in parts):
        return f"GPUs {theirs} (by UUID: compare with nvidia-smi -L)" if parts else ""
    both = sorted(set(ours) & {int(p) for p in parts})
    return f"GPU {', '.join(map(str, both))}" if both else ""


def check_fights(ctx: Context) -> list[CheckResult]:
    """WARN for each cron line, unit, supervisord program or process that fights us."""
    from vllmwatch.shell.groupfile import MARKER

    root = ctx.scan_root
    scan = Scan(root)
    found = crontabs(root, scan) + units(root, scan) + supervisors(root, scan)
    start = exitcodes.systemctl(exitcodes.unit_for(ctx.config.path), "start")  # an instance's
    running, visible = processes(ctx.proc_root, ctx.config.vllm.gpus, MARKER, start)
    found += running
    out = [CheckResult(f"fights {f.where}", WARN, f"{f.what}; it fights vllmwatch: {f.todo}")
           for f in found]
    out += [CheckResult(f"fights {where}", WARN, f"not scanned: {why}; a unit or cron file "
                        "that cannot be read may still start or kill vLLM: fix or remove it")
            for where, why in scan.unreadable]
    if scan.late:
        out.append(CheckResult("fights", WARN, f"the scan stopped at its {SCAN_TIMEOUT:g}s "
                               f"deadline; {len(scan.late)} files not read (first: "
                               f"{', '.join(scan.late[:3])}); the rest was scanned"))
    denied = scan.denied
    if denied or not visible:
        out.append(CheckResult("fights", SKIP, f"could not look as uid {os.geteuid()} "
                               f"({', '.join(denied[:3]) or 'other users processes'} not "
                               "readable); `sudo vllmwatch check` looks everywhere"))
    if not out:
        out.append(CheckResult("fights", PASS, "no cron job, unit, supervisord program or "
                               "hand-started vLLM that would fight vllmwatch"))
    return out
