"""Command line: parse arguments, wire the real implementations, map outcomes to exit codes."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import stat
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vllmwatch import __version__, take_closed_streams
from vllmwatch.config import command, startcaches, vllmflags, vllminfo
from vllmwatch.config.redact import REDACT
from vllmwatch.config.schema import Config, ConfigError, config_path, load
from vllmwatch.core import exitcodes
from vllmwatch.prewarm import runner as prewarm
from vllmwatch.shell import platform

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

# The sub-commands' own modules are imported when chosen: `status` and `check` should not pay
# for the daemon's imports (prometheus_client, structlog, the thread pool) on every call.


class _Parser(argparse.ArgumentParser):
    """argparse that lets a failed write of its help, version or usage raise (it dropped the
    error: `vllmwatch --help > /dev/full` exited 0 having printed nothing); main says it."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        if message:
            (file or sys.stderr).write(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="vllmwatch", description="Keep one vLLM server healthy under systemd.")
    parser.add_argument("--version", action="version", version=f"vllmwatch {__version__}")
    parser.add_argument("--config", "-c", action="append", dest="configs", metavar="CONFIG",
                        help="config file (default: $VLLMWATCH_CONFIG or "
                        "/etc/vllmwatch/vllmwatch.toml)")
    # --config is accepted before or after the sub-command. Each side's are kept apart
    # (the sub-command's namespace replaces a dest both share): two configs is a usage error,
    # where the last one was taken and the other was never looked at (_one_config).
    common = _Parser(add_help=False)
    common.add_argument("--config", "-c", action="append", dest="sub_configs",
                        metavar="CONFIG", default=argparse.SUPPRESS, help="config file")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, parents=[common])

    run = add("run", "supervise vLLM (the daemon)")
    run.add_argument("--log-format", choices=("auto", "journal", "json", "console"),
                     help="override log.format")
    run.add_argument("--no-prewarm", action="store_true", help="skip the pre-warm steps")
    check = add("check", "run the deployment checklist")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.add_argument("--fast", action="store_true",
                       help="skip slow steps (checksums, vLLM version); for ExecStartPre")
    check.add_argument("--config-only", action="store_true",
                       help="only load the config as a reload would (the units' ExecReload=); "
                       f"exit {exitcodes.CONFIG} when a reload would refuse it")
    add("print-command", "print the vLLM command line, secrets redacted")
    status = add("status", "show the running daemon's status")
    status.add_argument("--json", action="store_true", help="print the raw /status JSON")
    status.add_argument("--url", help="status endpoint (default: from the config's "
                        "status.listen)")
    incidents = add("incidents", "list the incident records, or `show ID` one")
    incidents.add_argument("action", nargs="?", choices=("show",), help="show one record")
    incidents.add_argument("id", nargs="?", help="the record's id (or a unique prefix)")
    incidents.add_argument("--json", action="store_true", help="machine-readable output")
    incidents.add_argument("--dir", help="the incidents folder (default: $STATE_DIRECTORY/"
                           "incidents, /var/lib/vllmwatch/incidents, then the state rule)")
    prewarm = add("prewarm", "run the pre-warm steps now and report")
    prewarm.add_argument("--json", action="store_true", help="machine-readable output")
    _add_init(add("init", "write a config from a `vllm serve` line or a running vLLM"))
    return parser


def _add_init(init: argparse.ArgumentParser) -> None:
    init.add_argument("--from-pid", type=int, metavar="PID",
                      help="read the command line and environment of this running vLLM")
    init.add_argument("--stdout", action="store_true", help="print the config, write nothing")
    init.add_argument("--force", action="store_true", help="replace an existing config")
    init.add_argument("--fast", action="store_true",
                      help="do not ask vLLM for its flags (only a cached list is used)")
    init.add_argument("--api-key-file", default="", metavar="PATH",
                      help="where the API key goes (default: next to the config, api-key for "
                      "vllmwatch.toml, NAME.api-key for NAME.toml)")
    init.add_argument("--gate", action="store_true",
                      help="put vllmwatch's front door on the line's address (vLLM moves to "
                           "loopback) so that requests wait during restarts")
    init.add_argument("words", nargs=argparse.REMAINDER,
                      help="the command line: -- vllm serve MODEL ... (or one quoted string)")


def load_config(path: str | None) -> Config:
    """Load the config named on the command line or in the environment."""
    return load(config_path(path))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `vllmwatch` console script."""
    # before any file is opened onto the free descriptor; `run` prints nothing there (it logs)
    if take_closed_streams() and not _runs(sys.argv[1:] if argv is None else argv):
        print("vllmwatch: standard output is closed (`>&-`): nothing could be printed; give "
              "it a file, or /dev/null to discard it", file=sys.stderr)
        return exitcodes.FAILURE
    for stream in (sys.stdout, sys.stderr):  # a lone surrogate in a record, a status
        # answer or a log line is printed escaped, never a UnicodeEncodeError's traceback
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    command = None
    try:
        parser = _parser()
        try:
            args = parser.parse_args(argv)
            command = args.command
            args.config = _one_config(parser, args)
            if command is None:
                parser.error("a command is required: one of " + ", ".join(_commands(parser)))
        except SystemExit as exc:  # --help, --version or a usage error, said by argparse;
            # what it could not write it drops: the flush below finds a full disk
            code = exc.code if isinstance(exc.code, int) else exitcodes.FAILURE
        else:
            if command == "run":  # until the loop takes them (vllmwatch/__init__.py)
                import vllmwatch
                vllmwatch.hold_signals((signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                                        signal.SIGUSR1))
            code = _dispatch(args)
        sys.stdout.flush()  # a full disk or a reader gone is met here, not at the exit
        return code
    except ConfigError as exc:
        print(f"vllmwatch: config error: {REDACT.text(str(exc))}", file=sys.stderr)
        return exitcodes.CONFIG
    except KeyboardInterrupt:  # Ctrl-C: the shell's code, a line, no traceback
        with contextlib.suppress(OSError):
            print("vllmwatch: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # `... | head` (the reader left), `> /dev/full`: a line, no traceback
        if exc.errno not in _OUTPUT_ERRORS or command == "run":
            raise
        with contextlib.suppress(OSError):  # what is still buffered goes nowhere at the exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if exc.errno != errno.EPIPE:  # (a reader that left needs no word)
            with contextlib.suppress(OSError):  # (stderr full too: the code says it)
                print(f"vllmwatch: cannot write: {exc.strerror or exc}", file=sys.stderr)
        return exitcodes.FAILURE


def _runs(argv: Sequence[str]) -> bool:
    """Whether the command named is `run` (its first word that is no option or --config's).
    argparse takes a unique start of a long option for it: `--conf PATH` is --config too."""
    words = iter(argv)
    for word in words:
        if word == "-c" or (len(word) > 2 and "--config".startswith(word)):
            next(words, None)
        elif not word.startswith("-"):
            return word == "run"
    return False


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def _one_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The one --config given (None: none); two different files are a usage error. One
    file named two ways (`-c a -c ./a`, a link to it) is one: the first spelling is used."""
    named = [*(args.configs or ()), *getattr(args, "sub_configs", ())]
    files: dict[str, str] = {}
    for name in named:
        files.setdefault(os.path.realpath(name), name)
    given = list(files.values())
    if len(given) > 1:
        parser.error(f"--config names {len(given)} files ({', '.join(map(repr, given))}): "
                     "give one")
    return given[0] if given else None


_OUTPUT_ERRORS = (errno.EPIPE, errno.ENOSPC, errno.EIO, errno.EDQUOT)


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "status":
        from vllmwatch.status import cli as status_cli

        return status_cli.main(args.config, args.url, args.json, _newest_incident)
    if args.command == "check":
        from vllmwatch.check import runner as check

        if args.config_only:
            return check.config_only(config_path(args.config), as_json=args.json)
        return check.main(config_path(args.config), as_json=args.json, fast=args.fast)
    if args.command == "incidents":
        from vllmwatch.incident import cli as incident_cli

        if args.dir and _no_folder(args.dir):
            # a file (the config, a record), a FIFO, a link loop: "no incident records" and
            # exit 0 said the folder was empty
            print(f"vllmwatch: --dir {args.dir!r} is not a folder; give the incidents folder "
                  "(e.g. /var/lib/vllmwatch/incidents)", file=sys.stderr)
            return 2
        if args.dir:  # that folder only
            return incident_cli.main(args.action, args.id, args.json, [args.dir], None)
        return incident_cli.main(args.action, args.id, args.json,
                                 _incident_roots(args.config))
    if args.command == "init":
        from vllmwatch.migrate import runner as init

        return init.main(init.Request(args.words, args.from_pid, config_path(args.config),
                                      args.stdout, args.force, args.fast, args.api_key_file,
                                      args.gate),
                         os.environ)
    config = load_config(args.config)
    if args.command == "print-command":
        return _print_command(config)
    if args.command == "prewarm":
        return prewarm.main(config, as_json=args.json,
                            unified=platform.detect(config, None).unified)
    import vllmwatch

    vllmwatch.pin()  # before the daemon's imports: one version of our code for its lifetime
    from vllmwatch import daemon

    return daemon.main(config, log_format=args.log_format, prewarm=not args.no_prewarm)


def _no_folder(path: str) -> bool:
    """Whether `path` is something that is no folder: not when it is not there (not made
    yet, or a link to what is not made yet) or closed to this user (incidents says so)."""
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except (FileNotFoundError, PermissionError):
        return False
    except OSError:  # a link loop; a file where a folder of the path should be
        return True


def _incident_roots(config_arg: str | None) -> list[str]:
    """Where the unit that runs this config keeps its records: -c /etc/vllmwatch/NAME.toml is
    vllmwatch@NAME's own folder (StateDirectory=vllmwatch/NAME), which the list never read:
    it said "no incident records" (exit 0) beside that instance's records."""
    from vllmwatch.incident import latest
    from vllmwatch.shell.incidents import roots
    from vllmwatch.status import stopped

    unit = stopped.unit_name(os.path.abspath(config_path(config_arg)))
    return latest.instance_roots(unit, roots(os.environ))


def _newest_incident(unit: str) -> dict[str, object] | None:
    """For `vllmwatch status` when nothing answers: the unit's newest incident record."""
    from vllmwatch.incident import latest
    from vllmwatch.shell.incidents import roots

    return latest.newest(latest.instance_roots(unit, roots(os.environ)))


def _print_command(config: Config) -> int:
    api_key = command.read_api_key(config)
    info = vllminfo.info(config.vllm.command)
    version = vllminfo.version(config.vllm.command)
    # RealEffects.spawn refuses these before it builds (fatal): not a command to copy either.
    caches = startcaches.problems(config, os.environ, info)
    if caches:
        print(f"vllmwatch: config error: {config.path}: {caches[0].key}: {caches[0].problem}",
              file=sys.stderr)
        return exitcodes.CONFIG
    cmd = command.build(config, os.environ, api_key=api_key, vllm_version=version,
                        extra_env=_cache_env(config, info))
    refused = _flag_refusal(config, version)
    if refused is not None:
        # What `run` would refuse is not a command to copy (issue 23).
        print(f"vllmwatch: config error: {REDACT.text(str(refused))}", file=sys.stderr)
        return exitcodes.CONFIG
    _say_unshown(config)
    print(cmd.display())
    return exitcodes.OK


def _say_unshown(config: Config) -> None:
    """What `run` adds per launch and this line cannot carry: said on stderr, so that stdout
    stays the one line to copy."""
    if "TMPDIR" not in config.vllm.env:
        print("vllmwatch: note: each `run` launch also gets a private TMPDIR (removed after "
              "the child; set TMPDIR in [vllm.env] to choose it)"
              + (" and the incident faulthandler hook on PYTHONPATH" if
                 config.incidents.enabled else "") + "; not needed by hand", file=sys.stderr)
    if config.spare.considered(config.gate.enabled) and config.vllm.uses_gpu:
        print("vllmwatch: note: with the [spare] plan on, `run` lowers the serving engine's "
              "--gpu-memory-utilization (the row spare.serving of `vllmwatch check` says to "
              "what); the line shows the configured value", file=sys.stderr)


def _flag_refusal(config: Config, version: str | None) -> str | None:
    """`run`'s refusal of flags this vLLM lacks; asks vLLM (once per version) if not cached."""
    cache = vllmflags.default_cache_dir(config, os.environ)
    known = vllmflags.known_flags(config.vllm.command, version, cache, ask=False)
    if known is None and version is not None:
        print(f"vllmwatch: asking vLLM {version} for its flags (once per version)...",
              file=sys.stderr)
        known = vllmflags.known_flags(config.vllm.command, version, cache)
    return None if known is None else vllmflags.refusal_text(config, known)


def _cache_env(config: Config, info: startcaches.VllmInfo) -> dict[str, str]:
    """The launch's cache variables as shell/versions.CacheEnv gives them: ours, and vLLM's
    start-up caches (without these a hand run compiles under another cache key)."""
    unified = platform.detect(config, None).unified
    ours = {}
    for name, path in prewarm.cache_env(config, os.environ).items():
        why = prewarm.cannot_make(path, name)  # `run` leaves it out too (prewarm.cache_unusable)
        if why is None:
            ours[name] = path
        else:
            print(REDACT.text(f"vllmwatch: note: {name}={path} left out ({why}); `run` "
                              "would use a private folder of its state directory for it (or "
                              "vLLM's default); set prewarm.cache_dir to a directory only you "
                              "can write"), file=sys.stderr)
    return {**ours, **startcaches.decide(config, os.environ, info, unified).env}
