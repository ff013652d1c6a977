"""`vllmwatch init`'s output: the files (the config 0640; the key and secrets files 0600, the
service user's), what changed, what replaces the old cron job, `check` on the result, and the
commands that come next. A file that cannot be written is one line naming it and what to do,
never a traceback; nothing is half-written (each file goes in by an atomic rename, the
secrets before the config that names them)."""

from __future__ import annotations

import contextlib
import grp
import hashlib
import os
import pwd
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from typing import TextIO

from vllmwatch.check.fights import MEMORY_RULES
from vllmwatch.config import flags, safefile
from vllmwatch.config.convert import printable
from vllmwatch.config.redact import REDACT
from vllmwatch.config.schema import ConfigError, load
from vllmwatch.migrate.draft import SERVICE_USER, Draft, Facts
from vllmwatch.migrate.envwords import key_file_todo

CONFIG, OK = 2, 0
UNIT_CONFIG = "/etc/vllmwatch/vllmwatch.toml"  # the unit's VLLMWATCH_CONFIG
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.-]+")  # an instance name systemd takes as written


class WriteError(Exception):
    """A file init cannot write; the message names it and what to do."""


@dataclass(frozen=True)
class Out:
    """Where init writes (the config, or only prints it) and talks."""

    output: str
    stdout: bool
    force: bool
    full_check: bool


def deliver(how: Out, text: str, draft: Draft, facts: Facts, out: TextIO, err: TextIO) -> int:
    """Load-test the text, write (or print) it and its secrets, report; 0 or 2."""
    if draft.fatal:  # a line vLLM refuses, or a config without its secret: never written
        for error in [*draft.fatal, *draft.errors]:
            print(f"error: {REDACT.text(error)}", file=err)
        print("vllmwatch init: nothing written: the config would not do what the line did",
              file=err)
        return CONFIG
    with tempfile.TemporaryDirectory(prefix="vllmwatch-init-") as scratch:
        target = os.path.join(scratch, os.path.basename(how.output) or "vllmwatch.toml")
        with open(target, "w", encoding="utf-8") as fh:
            fh.write(text)
        try:
            loaded = load(target)
            # what a reload refuses too (check --config-only, the units' ExecReload=): the
            # flags vLLM or vllmwatch would refuse at the launch (`--help`, `--config` twice)
            refused = flags.args_problems(loaded.vllm.args, loaded.vllm.extra_args)
            if refused:
                raise ConfigError(target, refused[0].key, refused[0].problem)
        except ConfigError as exc:
            problem = REDACT.text(str(exc).replace(target, "the config"))
            print(f"vllmwatch init: the config would not load: {problem}", file=err)
            for error in draft.errors:
                print(f"error: {REDACT.text(error)}", file=err)
            print("nothing written: fix the line (or the running vLLM's) and run init again",
                  file=err)
            return CONFIG
        checked = target
        if how.stdout:
            print(text, end="", file=out)
            _secrets_todo(draft, facts, err)
        else:
            try:
                _write_all(how, text, draft, facts)
            except WriteError as exc:
                print(f"vllmwatch init: {REDACT.text(str(exc))}", file=err)
                return CONFIG
            checked = how.output
            print(f"vllmwatch init: wrote {printable(how.output, False)}", file=err)
        summary(draft, err)
        report = err if how.stdout else out
        _check(checked, how.full_check, report)
        next_steps(how.output, how.stdout, draft, report)
    return OK


def _secrets_todo(draft: Draft, facts: Facts, err: TextIO) -> None:
    """--stdout writes nothing: say which files the printed config needs (never the values)."""
    if draft.api_key is not None:
        draft.todo.append(key_file_todo(facts.api_key_file))
    if draft.secret_env or draft.secret_args:
        names = ", ".join(sorted({*draft.secret_env, *(n for n, _ in draft.secret_args)}))
        draft.todo.append(f"create {facts.env_file} (mode 0600, the service user's) with "
                          f"NAME=value lines for {names}, as the hand-run line had them")


def _write_all(how: Out, text: str, draft: Draft, facts: Facts) -> None:
    files = []
    if draft.api_key is not None:
        files.append((facts.api_key_file, draft.api_key + "\n", 0o600))
    if draft.secret_env or draft.secret_args:
        body = "".join(f"{k}={v}\n" for k, v in [*sorted(draft.secret_env.items()),
                                                  *draft.secret_args])
        files.append((facts.env_file, "# written by vllmwatch init: NAME=value, read at each "
                      "launch (vllm.env_file)\n" + body, 0o600))
    seen = {_same(how.output): "the config"}
    for path, what in [(p, "the API key file" if p == facts.api_key_file else
                        "the secrets file") for p, _, _ in files]:
        if _same(path) in seen:  # the later rename would put one over the other
            raise WriteError(f"{path} would be both {seen[_same(path)]} and {what}; give each "
                             "its own path (-c, --api-key-file); nothing written")
        seen[_same(path)] = what
    for path, _, _ in files:  # all refused before any is written
        if os.path.lexists(path) and not how.force:
            raise WriteError(f"{path} exists; not replaced (--force replaces it; nothing "
                             "written)")
    staged: list[tuple[str, str]] = []
    try:  # every file staged beside its target first: a failure leaves nothing behind
        for path, body, mode in [(how.output, text, 0o640), *files]:
            staged.append((stage(path, body, mode), path))
        for tmp, path in [*staged[1:], staged[0]]:  # the secrets before the config naming them
            try:
                os.replace(tmp, path)
            except OSError as exc:
                raise WriteError(_why(path, os.path.dirname(os.path.abspath(path)), exc)
                                 ) from None
    finally:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def package_default(path: str) -> bool:
    """The file is the config the vllmwatch package installed, as dpkg installed it (its
    conffile checksum): the example shipped at the unit's path, which `apt install` puts there
    before the first `init` (install.md's next command). Replacing it loses no edit of anyone's;
    dpkg still sees it changed at the next upgrade and asks. False on any doubt: no dpkg, not
    installed from the package, edited, unreadable."""
    try:
        listed = subprocess.run(["dpkg-query", "-W", "-f=${Conffiles}\\n", "vllmwatch"],
                                capture_output=True, text=True, timeout=5, check=False,
                                stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    target = os.path.abspath(path)
    sums = {w[0]: w[1] for w in (line.split() for line in listed.splitlines()) if len(w) >= 2}
    if target not in sums:
        return False
    try:
        body = safefile.read_bounded(target, nofollow=True)
    except safefile.FileProblem:
        return False
    return hashlib.md5(body, usedforsecurity=False).hexdigest() == sums[target]


def _same(path: str) -> str:
    """The file a path names, through links (`-c ./k` and `--api-key-file k` are one)."""
    return os.path.realpath(os.path.abspath(path))


def stage(path: str, text: str, mode: int) -> str:
    """A temporary file beside path with text and `mode`, to rename over it; as root, 0640
    goes to root:vllmwatch (the service reads, only root edits) and 0600 to the service user
    (it alone reads its secrets). WriteError with one line that names the path and what to
    do."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) and not os.path.islink(path):
        raise WriteError(f"cannot write {path}: it is a directory; name a file, not a "
                         "folder; nothing written")
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".init-", dir=directory)
    except OSError as exc:
        raise WriteError(_why(path, directory, exc)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        if os.geteuid() == 0:
            _owner(tmp, mode)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise WriteError(_why(path, directory, exc)) from None
    return tmp


def _owner(path: str, mode: int) -> None:
    # No vllmwatch user or group yet (package not installed): root's, still safe.
    with contextlib.suppress(KeyError):
        if mode == 0o600:
            user = pwd.getpwnam(SERVICE_USER)
            os.chown(path, user.pw_uid, user.pw_gid)
        else:
            os.chown(path, 0, grp.getgrnam(SERVICE_USER).gr_gid)


def _why(path: str, directory: str, exc: OSError) -> str:
    reason = exc.strerror or str(exc)
    if isinstance(exc, PermissionError) or exc.errno == 30:  # EROFS
        todo = (f"{directory} is not writable by this user: run as root (sudo), or give "
                "another path with -c (or --stdout to print the config)")
    elif isinstance(exc, (NotADirectoryError, FileNotFoundError, FileExistsError)):
        todo = "a part of the path is not a folder: give another path with -c"
    else:
        todo = "give another path with -c, or --stdout to print the config"
    return f"cannot write {path}: {reason}; {todo}; nothing written"


def summary(draft: Draft, err: TextIO) -> None:
    """What changed, what is wrong, what init decided for the person, what to do."""
    print(f"{draft.changed} flag(s) changed or dropped; each has a comment in the file",
          file=err)
    for error in draft.errors:
        print(f"error: {REDACT.text(error)}", file=err)
    for said in draft.said:
        print(f"note: {REDACT.text(said)}", file=err)
    for todo in draft.todo:
        print(f"to do: {REDACT.text(todo)}", file=err)
    print("note: a cron job that restarts vLLM past a memory figure (the guides' 75000 MiB "
          f"of nvidia-smi): {MEMORY_RULES}", file=err)


def next_steps(output: str, stdout: bool, draft: Draft, out: TextIO) -> None:
    """The commands that take the box from the hand-run vLLM to the service."""
    config = shlex.quote(output)
    lines = ["", "next steps:"]
    if stdout:
        lines.append(f"  0. save the config above as {config} (or run init without --stdout)")
    # /etc/vllmwatch/NAME.toml is the config of the template's instance vllmwatch@NAME (one
    # per GPU or model): its unit, not "copy it over the main unit's config"
    folder, name = os.path.split(os.path.abspath(output))
    instance = name[:-5] if folder == os.path.dirname(UNIT_CONFIG) and name.endswith(
        ".toml") and output != UNIT_CONFIG and _UNIT_NAME.fullmatch(name[:-5]) else ""
    unit, status = ((f"vllmwatch@{instance}", f"vllmwatch status -c {config}") if instance
                    else ("vllmwatch", "vllmwatch status"))
    if output != UNIT_CONFIG and not instance:
        lines.append(f"  - the unit reads {UNIT_CONFIG}: copy the config there, or set "
                     "VLLMWATCH_CONFIG in a drop-in (sudo systemctl edit vllmwatch)")
    lines += ["  1. stop the hand-run vLLM, and delete the cron lines or units `check` names "
              "under `fights`",
              f"  2. sudo -u {SERVICE_USER} vllmwatch check --config {config}"
              "    # as the service will run it",
              f"  3. sudo systemctl enable --now {unit}    # then: {status}"]
    print("\n".join(lines), file=out)


def _check(path: str, full: bool, out: TextIO) -> None:
    from vllmwatch.check import runner as check

    print(f"\n$ vllmwatch check{'' if full else ' --fast'} -c {shlex.quote(path)}", file=out)
    with open(os.devnull, "w", encoding="utf-8") as quiet:
        check.main(path, as_json=False, fast=not full, out=out, err=quiet)
