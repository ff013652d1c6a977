"""`vllmwatch init`: read the line or the running vLLM, learn this vLLM's flags, write the
config (never over an existing one without --force; 0640 root:vllmwatch as root), say what
changed and what to do, then run `check` on the result.

Exit codes: 0 written (or printed), 2 nothing written (bad input, or the file exists).
"""

from __future__ import annotations

import contextlib
import grp
import os
import shlex
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO

from vllmwatch.config import serveline, vllmflags, vllminfo
from vllmwatch.config.command import redact_argv
from vllmwatch.config.schema import Config, ConfigError, load
from vllmwatch.migrate import proc, render, translate
from vllmwatch.migrate.draft import Draft, Facts
from vllmwatch.shell import child

CONFIG, OK = 2, 0


@dataclass(frozen=True)
class Request:
    """What the person asked for."""

    words: list[str]
    from_pid: int | None
    output: str
    stdout: bool = False
    force: bool = False
    fast: bool = False
    api_key_file: str = ""


def main(req: Request, environ: Mapping[str, str], out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    """Run init; 0 when the config was written (or printed), 2 when nothing was."""
    out, err = out or sys.stdout, err or sys.stderr
    if not req.stdout and os.path.exists(req.output) and not req.force:
        print(f"vllmwatch init: {req.output} exists; not replaced (--force replaces it, "
              "--stdout prints the new config instead)", file=err)
        return CONFIG
    try:
        line, source, facts, notes = _read(req, environ, err)
    except (serveline.LineError, proc.ProcError) as exc:
        print(f"vllmwatch init: {exc}", file=err)
        return CONFIG
    draft = translate.translate(line, facts)
    text = render.render(draft, source)
    for note in notes:
        print(f"note: {note}", file=err)
    return _deliver(req, text, draft, facts, out, err)


def _read(req: Request, environ: Mapping[str, str], err: TextIO
          ) -> tuple[serveline.ServeLine, str, Facts, list[str]]:
    notes: list[str] = []
    cwd: str | None = os.getcwd()
    path = environ.get("PATH", "")
    if req.from_pid is not None:
        running = proc.read(req.from_pid, marker=child.MARKER)
        if running.supervised:
            notes.append(f"pid {running.pid} is already supervised by a vllmwatch")
        line = serveline.parse(running.argv)
        line = serveline.ServeLine({**running.env, **line.env}, line.command, line.rest)
        cwd, path, notes = running.cwd, running.path or path, notes + running.notes
        source = f"pid {running.pid}: " + shlex.join(redact_argv(running.argv))
    else:
        words = req.words[1:] if req.words[:1] == ["--"] else req.words
        if not words:
            raise serveline.LineError("give the command line: vllmwatch init -- vllm serve "
                                      "MODEL ..., or --from-pid PID")
        text = " ".join(words) if len(words) == 1 else shlex.join(words)
        line = serveline.parse(serveline.split_text(text) if len(words) == 1 else words)
        source = shlex.join(redact_argv([*line.command, *line.rest]))
    command = list(line.command)
    full = proc.which(command[0], path, cwd) if not command[0].startswith("/") else None
    known = _known([full or command[0], *command[1:]], req.fast, err)
    facts = Facts(known=known, api_key_file=req.api_key_file or os.path.join(
                      os.path.dirname(os.path.abspath(req.output)), "api-key"),
                  has_gpu=os.path.exists("/dev/nvidiactl"), cwd=cwd,
                  gpu_index=_gpu_index(), resolve=lambda w: full if w == command[0] else None,
                  exists=os.path.exists)
    return line, source, facts, notes


def _known(command: list[str], fast: bool, err: TextIO) -> vllmflags.FlagSet | None:
    """This vLLM's flag list: cached, else asked (unless --fast)."""
    version = vllminfo.version(command)
    cache = vllmflags.default_cache_dir(Config(), os.environ)
    known = vllmflags.known_flags(command, version, cache, ask=False)
    if (known is None or not known.kinds) and version is not None and not fast:
        print(f"vllmwatch init: asking vLLM {version} for its flags (once per version)...",
              file=err)
        known = vllmflags.known_flags(command, version, cache) or known
    if known is None:
        print("vllmwatch init: vLLM's flag list is unknown here (not installed for "
              f"{command[0]!r}, or --fast with nothing cached): flags typed by their looks "
              "and not checked", file=err)
    return known


def _gpu_index() -> dict[str, int]:
    """GPU UUID -> index, from NVML when there is one."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no library: no UUIDs to map
        return {}
    try:
        out = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            out[uuid.decode() if isinstance(uuid, bytes) else str(uuid)] = i
        return out
    except Exception:
        return {}
    finally:
        pynvml.nvmlShutdown()


def _deliver(req: Request, text: str, draft: Draft, facts: Facts, out: TextIO,
             err: TextIO) -> int:
    with tempfile.TemporaryDirectory(prefix="vllmwatch-init-") as scratch:
        target = os.path.join(scratch, os.path.basename(req.output) or "vllmwatch.toml")
        with open(target, "w", encoding="utf-8") as fh:
            fh.write(text)
        try:
            load(target)
        except ConfigError as exc:  # a bug of ours: say so, write nothing
            print(f"vllmwatch init: the config written does not load ({exc}); nothing "
                  "written (a vllmwatch bug; please report it)", file=err)
            return CONFIG
        if req.stdout:
            print(text, end="", file=out)
            checked = target
        else:
            _write(req.output, text)
            checked = req.output
            print(f"vllmwatch init: wrote {req.output}", file=err)
        _summary(draft, err)
        _check(checked, facts.known is not None and not req.fast, err if req.stdout else out)
    return OK


def _write(path: str, text: str) -> None:
    """Atomically, 0640; root:vllmwatch when root (the service reads, only root edits)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".init-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o640)
        if os.geteuid() == 0:
            # No group yet (package not installed): root:root 0640 is still safe.
            with contextlib.suppress(KeyError):
                os.chown(tmp, 0, grp.getgrnam("vllmwatch").gr_gid)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _summary(draft: Draft, err: TextIO) -> None:
    print(f"{draft.changed} flag(s) changed or dropped; each has a comment in the file",
          file=err)
    for error in draft.errors:
        print(f"error: {error}", file=err)
    for todo in draft.todo:
        print(f"to do: {todo}", file=err)


def _check(path: str, full: bool, out: TextIO) -> None:
    from vllmwatch.check import runner as check

    print(f"\n$ vllmwatch check{'' if full else ' --fast'} -c {shlex.quote(path)}", file=out)
    with open(os.devnull, "w", encoding="utf-8") as quiet:
        check.main(path, as_json=False, fast=not full, out=out, err=quiet)
