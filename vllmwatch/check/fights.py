"""What fights the service: the pieces of a hand-run vLLM that keep running beside vllmwatch.

A cron job that `pkill -f "vllm serve"`s past a memory figure kills the vLLM vllmwatch
supervises (which then reports a crash no one understands); a hand-written unit or a
supervisord program starts a second vLLM on the same GPUs; a `nohup vllm serve` still holds
them. Each is a WARN naming the file and line or the pid, and what to do. Read-only. Every
scanner takes a root directory (and /proc a directory) so that tests plant files under a
temporary one. Reading other users' crontabs and processes needs root: the service user
(ProtectProc=invisible) is told once that it could not look.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from vllmwatch.check.base import PASS, SKIP, WARN, CheckResult, Context
from vllmwatch.config.redact import REDACT
from vllmwatch.config.serveline import is_vllm_serve, shown

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


def _lines(path: str) -> Iterator[tuple[int, str]]:
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            text = line.strip()
            if text and not text.startswith(("#", ";")):
                yield number, text


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
        out += sorted(p for p in glob.glob(os.path.join(root, pattern)) if os.path.isfile(p))
    return list(dict.fromkeys(out))


def _shown(root: str, path: str) -> str:
    return "/" + os.path.relpath(path, root) if root != "/" else path


def crontabs(root: str, denied: list[str]) -> list[Finding]:
    """Cron lines (and the scripts they run) that kill, restart or start vLLM."""
    out = []
    for spool in ("var/spool/cron/crontabs", "var/spool/cron"):
        directory = os.path.join(root, spool)
        if os.path.isdir(directory) and not os.access(directory, os.R_OK | os.X_OK):
            denied.append(_shown(root, directory))  # users' crontabs: root only
    for path in _files(root, _CRON_FILES):
        user_tab = "/var/spool/cron" in path
        todo = (f"crontab -e -u {os.path.basename(path)}" if user_tab else
                f"delete the line from {_shown(root, path)}")
        try:
            for number, text in _lines(path):
                out += _cron_line(root, path, number, text, todo)
        except PermissionError:
            denied.append(_shown(root, path))
    return out


def _cron_line(root: str, path: str, number: int, text: str, todo: str) -> list[Finding]:
    where = f"{_shown(root, path)}:{number}"
    verdict = _verdict(text)
    if verdict is not None:
        if verdict.startswith("kills") and _GPU_QUERY.search(text):
            todo += f"; {MEMORY_RULES}"
        return [Finding(where, f"{verdict}: {text[:120]}", todo)]
    for word in text.split():  # a script the line runs: one level deep
        script = os.path.join(root, word.lstrip("/")) if word.startswith("/") else ""
        if script and os.path.isfile(script) and os.path.getsize(script) < 65536:
            for n, line in _lines(script):
                found = _verdict(line)
                if found is not None:
                    return [Finding(where, f"runs {word}, which {found} at its line {n}",
                                    todo)]
    return []


def units(root: str, denied: list[str]) -> list[Finding]:
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
            out += _unit(root, path, name, denied)
    return out


def _unit(root: str, path: str, name: str, denied: list[str]) -> list[Finding]:
    timer = os.path.join(os.path.dirname(path), name.removesuffix(".service") + ".timer")
    stop = name.removesuffix(".service") + (".timer" if os.path.exists(timer) else "")
    try:
        for number, text in _lines(path):
            if not text.startswith("Exec"):
                continue
            verdict = _verdict(text.partition("=")[2])
            if verdict is not None:
                return [Finding(f"{_shown(root, path)}:{number}", f"{name}: {verdict}",
                                f"systemctl disable --now {stop}")]
    except (PermissionError, IsADirectoryError):
        denied.append(_shown(root, path))
    return []


def supervisors(root: str, denied: list[str]) -> list[Finding]:
    """supervisord programs that run vLLM."""
    out = []
    for path in _files(root, _SUPERVISOR):
        program = ""
        try:
            for number, text in _lines(path):
                if text.startswith("[program:"):
                    program = text[len("[program:"):].rstrip("]")
                elif text.startswith("command") and _verdict(text.partition("=")[2]):
                    out.append(Finding(f"{_shown(root, path)}:{number}",
                                       f"supervisord program {program!r} runs vLLM "
                                       f"({text[:80]})", f"supervisorctl stop {program} and "
                                       f"delete its section from {_shown(root, path)}"))
        except PermissionError:
            denied.append(_shown(root, path))
    return out


def processes(proc: str, gpus: list[int] | None, marker: str) -> tuple[list[Finding], bool]:
    """`vllm serve` processes not started by a vllmwatch, on our GPUs; (found, all visible)."""
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
                               f"stop it (kill {pid}) before `systemctl start vllmwatch`, "
                               "and remove what starts it"))
    visible = os.geteuid() == 0 or os.path.exists(os.path.join(proc, "1", "cmdline"))
    return out, visible


def _read0(path: str) -> list[str]:
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
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
    if any(not p.isdigit() for p in parts):
        return f"GPUs {theirs} (by UUID: compare with nvidia-smi -L)" if parts else ""
    both = sorted(set(ours) & {int(p) for p in parts})
    return f"GPU {', '.join(map(str, both))}" if both else ""


def check_fights(ctx: Context) -> list[CheckResult]:
    """WARN for each cron line, unit, supervisord program or process that fights us."""
    from vllmwatch.shell.groupfile import MARKER

    root, denied = ctx.scan_root, list[str]()
    found = crontabs(root, denied) + units(root, denied) + supervisors(root, denied)
    running, visible = processes(ctx.proc_root, ctx.config.vllm.gpus, MARKER)
    found += running
    out = [CheckResult(f"fights {f.where}", WARN, f"{f.what}; it fights vllmwatch: {f.todo}")
           for f in found]
    if denied or not visible:
        out.append(CheckResult("fights", SKIP, f"could not look as uid {os.geteuid()} "
                               f"({', '.join(denied[:3]) or 'other users processes'} not "
                               "readable); `sudo vllmwatch check` looks everywhere"))
    if not out:
        out.append(CheckResult("fights", PASS, "no cron job, unit, supervisord program or "
                               "hand-started vLLM that would fight vllmwatch"))
    return out
