"""The flags the configured vLLM accepts, asked of vLLM itself once and cached per version.

Building `vllm serve`'s argument parser imports torch (seconds), so it runs once in a
subprocess of vLLM's own interpreter; the answer is cached on disk per vLLM version and
executable, in a directory only we can write. When vLLM cannot be asked (not installed,
too slow, an unknown layout), callers warn and carry on: this check never blocks a start.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vllmwatch.config import flags, private, vllminfo
from vllmwatch.config.errors import Problem
from vllmwatch.config.schema import Config

ASK_TIMEOUT_S = 120.0  # importing torch on a loaded 2-core box took 38 s
_MARK = "VLLMWATCH_FLAGS "
# vLLM moved make_arg_parser between releases; try the known homes, newest first.
_PROBE = """
import json, importlib
for mod, cls in (("vllm.entrypoints.launchers.cli_args", "vllm.utils.argparse_utils"),
                 ("vllm.entrypoints.openai.cli_args", "vllm.utils.argparse_utils"),
                 ("vllm.entrypoints.openai.cli_args", "vllm.utils")):
    try:
        make = importlib.import_module(mod).make_arg_parser
        parser_cls = importlib.import_module(cls).FlexibleArgumentParser
    except (ImportError, AttributeError):
        continue
    parser = make(parser_cls(prog="vllm serve"))
    out = {s[2:]: a.nargs == 0 for a in parser._actions for s in a.option_strings
           if s.startswith("--")}
    print("MARK" + json.dumps(out), flush=True)
    break
""".replace("MARK", _MARK)


@dataclass(frozen=True)
class FlagSet:
    """The long flags (no dashes) of one vLLM version; `switches` take no value."""

    version: str
    flags: frozenset[str]
    switches: frozenset[str]


def default_cache_dir(config: Config, environ: Mapping[str, str]) -> str:
    """$CACHE_DIRECTORY or prewarm.cache_dir when usable, else $XDG_CACHE_HOME/vllmwatch."""
    # Per user: a directory root made would be refused (not ours) by the service user.
    name = f"vllm-flags-{os.geteuid()}"
    root = environ.get("CACHE_DIRECTORY", "").split(":")[0] or config.prewarm.cache_dir
    if root and os.access(root, os.W_OK | os.X_OK):
        return os.path.join(root, name)
    xdg = environ.get("XDG_CACHE_HOME") or os.path.join(str(Path.home()), ".cache")
    return os.path.join(xdg, "vllmwatch", name)


def known_flags(command: list[str] | tuple[str, ...], version: str | None,
                cache_dir: str | None, *, ask: bool = True,
                timeout: float = ASK_TIMEOUT_S) -> FlagSet | None:
    """The flags of the vLLM that `command` runs; None when they cannot be learnt.

    With ask=False only the cache is consulted (for fast checks).
    """
    python = vllminfo.interpreter(command)
    if version is None or python is None:
        return None
    key = hashlib.sha256(f"{version}\0{python}".encode()).hexdigest()[:16]
    directory = private.ensure_dir(cache_dir) if cache_dir else None
    path = os.path.join(directory, f"{key}.json") if directory else None
    cached = _read(path, version) if path else None
    if cached is not None or not ask:
        return cached
    got = _ask(python, version, timeout)
    if got is not None and path is not None:
        private.write_text(path, json.dumps({"version": version, "flags": sorted(got.flags),
                                             "switches": sorted(got.switches)}))
    return got


def _read(path: str, version: str) -> FlagSet | None:
    text = private.read_text(path)
    if text is None:
        return None
    try:
        data = json.loads(text)
        if data["version"] != version:
            return None
        return FlagSet(version, frozenset(data["flags"]), frozenset(data["switches"]))
    except (ValueError, KeyError, TypeError):
        return None


def _ask(python: str, version: str, timeout: float) -> FlagSet | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    try:
        out = subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True,
                             timeout=timeout, check=False, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.stdout.splitlines():
        if line.startswith(_MARK):
            try:
                table = json.loads(line[len(_MARK):])
            except ValueError:
                return None
            return FlagSet(version, frozenset(table),
                           frozenset(k for k, v in table.items() if v))
    return None


def validate_args(config: Config, known: FlagSet) -> list[Problem]:
    """Every [vllm.args] key and extra_args flag that this vLLM does not accept."""
    names = [(flags.flag_name(k), v, f"vllm.args.{k}") for k, v in config.vllm.args.items()]
    extra = config.vllm.extra_args
    for i, token in enumerate(extra):
        if token.startswith("--"):
            name, eq, inline = token[2:].partition("=")
            value = inline if eq else flags.next_value(extra, i)
            names.append((flags.flag_name(name), value, f"vllm.extra_args[{i}]"))
    out = []
    for name, value, key in names:
        problem = _flag_problem(name, value, key, known)
        if problem is not None:
            out.append(problem)
    return out


def _flag_problem(name: str, value: object, key: str, known: FlagSet) -> Problem | None:
    base = name.split(".")[0]  # --compilation-config.level=3 sets one field of a JSON flag
    legacy = flags.flag_problem(base, value, key, known.version)
    if legacy is not None and base in flags.REMOVED:
        return legacy
    if base not in known.flags:
        close = difflib.get_close_matches(base, sorted(known.flags), n=2, cutoff=0.75)
        hint = ("; did you mean " + " or ".join(close) + "?") if close else (
            "; see `vllm serve --help=all` for the flags it accepts")
        return Problem(key, f"--{base} is not a flag of vLLM {known.version}{hint}")
    if value is False and f"no-{base}" not in known.flags and "." not in name:
        return Problem(key, f"--{base} has no --no-{base} form in vLLM {known.version}; "
                       "delete the key (off is the default)")
    if base in known.switches and not isinstance(value, bool) and "." not in name:
        return Problem(key, f"--{base} takes no value in vLLM {known.version}; write "
                       f"{base} = true")
    return None


def preflight(config: Config, environ: Mapping[str, str], version: str | None
              ) -> tuple[list[Problem], str | None]:
    """The daemon's check before a launch: (problems, why the flags are unknown or None).

    Problems mean vLLM would exit at once with `unrecognized arguments`: refuse the start.
    A reason instead means vLLM could not be asked: log it as a warning and launch anyway.
    """
    known = known_flags(config.vllm.command, version, default_cache_dir(config, environ))
    if known is None:
        return [], ("cannot ask vLLM for its flags (not installed for this interpreter, "
                    "too slow, or an unknown vLLM layout); [vllm.args] is not checked")
    return validate_args(config, known), None
