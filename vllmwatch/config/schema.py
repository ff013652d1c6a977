"""The configuration's front: TOML loading and validation into the typed, frozen Config of
sections.py (where every default lives), with one error that lists every problem."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

from vllmwatch.config import flags, safefile
from vllmwatch.config.bounds import bounds_of
from vllmwatch.config.convert import CONVERTERS, choice, show, valid_args
from vllmwatch.config.crosschecks import cross_checks
from vllmwatch.config.errors import (
    ConfigError,
    Problem,
    cut_name,
    line_of,
    nearest,
    raise_all,
    same_key,
    unknown,
)
from vllmwatch.config.sections import (
    SECTIONS,
    Config,
    DrainConfig,
    GateConfig,
    IncidentsConfig,
    LogConfig,
    MemoryConfig,
    PrewarmConfig,
    ProbeConfig,
    RestartConfig,
    SpareConfig,
    StartupConfig,
    StatusConfig,
    VllmConfig,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

DEFAULT_PATH = "/etc/vllmwatch/vllmwatch.toml"
# Arrays of tables ([[smoke]], [[adapters]]): parsed by their own modules, not by SECTIONS.
ARRAYS = ("smoke", "adapters")
# The section types are re-exported: callers import the config from one place.
__all__ = [
    "SECTIONS",
    "Config",
    "ConfigError",
    "DrainConfig",
    "GateConfig",
    "IncidentsConfig",
    "LogConfig",
    "MemoryConfig",
    "PrewarmConfig",
    "ProbeConfig",
    "Problem",
    "RestartConfig",
    "SpareConfig",
    "StartupConfig",
    "StatusConfig",
    "VllmConfig",
    "config_path",
    "from_dict",
    "line_of",
    "load",
]


COMMAND_LINE = "(command line)"  # a ConfigError's path when the command line itself is wrong


def config_path(cli_value: str | None) -> str:
    """The config file to read: --config, then $VLLMWATCH_CONFIG, then the default. An empty
    --config is refused, not read as none: the units pass `--config ${VLLMWATCH_CONFIG}`, and
    an instance whose drop-in set it to nothing ran (and reloaded) the default config."""
    if cli_value is not None and not cli_value.strip():
        raise ConfigError(COMMAND_LINE, "--config", f"an empty path ({cli_value!r}): give the "
                          "config file's path (a unit's Environment=VLLMWATCH_CONFIG= set to "
                          "nothing?)")
    return cli_value or os.environ.get("VLLMWATCH_CONFIG") or DEFAULT_PATH


def load(path: str) -> Config:
    """Read, parse and validate a config file; raise ConfigError listing every problem."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        # Its name is text everywhere after this (the instance's id and lock, the unit's
        # name, logs): a byte that is not UTF-8 crashed `run` (exit 70) and `check` after
        # the load had passed
        raise ConfigError(path, "", f"the path {os.fsencode(path)!r} is not UTF-8 text; "
                          "rename the file (or its folder) with a UTF-8 name") from None
    try:
        raw = safefile.read_bounded(path)
    except safefile.FileProblem as exc:
        # (where to point, for a file not there; who may read it, for one this user may not)
        hint = {errno.ENOENT: " (pass --config PATH or set VLLMWATCH_CONFIG)",
                errno.EACCES: f" (running as uid {os.geteuid()}: the unit runs as the user "
                "vllmwatch, which must read it; `sudo -u vllmwatch vllmwatch check` reads it as "
                "the daemon does)"}.get(exc.errno or 0, "")
        raise ConfigError(path, "", f"{exc}{hint}") from None
    try:
        # A byte-order mark (Notepad's UTF-8) is not TOML, but is no reason to refuse it
        text = raw.decode("utf-8-sig")
        data = tomllib.loads(text)
    except UnicodeDecodeError as exc:
        # the line, which an editor goes to (a byte offset it does not), and that line's key
        # (its key only when the line starts with one: a line of a multi-line string is text)
        line = raw[:exc.start].count(b"\n") + 1
        key = re.match(rb"\s*([\w.-]{1,64})\s*=", raw.splitlines()[line - 1])
        said = f", key {key[1].decode()}" if key else ""
        raise ConfigError(path, "", f"not UTF-8 text ({exc.reason} at byte {exc.start}, line "
                          f"{line}{said}); save the file as UTF-8", line) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "", f"invalid TOML: {_twice(str(exc), text)}") from None
    except ValueError:  # Python's cap on int digits (4300): tomllib lets it through
        raise ConfigError(path, "", "invalid TOML: a number of more than 4300 digits (no "
                          "setting takes such a number)") from None
    except RecursionError:
        raise ConfigError(path, "", "invalid TOML: arrays or tables nested too deep (no "
                          "setting nests more than a few levels)") from None
    try:
        config = from_dict(data, path)
    except ConfigError as exc:
        raise exc.with_lines(text) from None
    return dataclasses.replace(config, sha256=hashlib.sha256(raw).hexdigest())


def _twice(message: str, text: str) -> str:
    """tomllib's message, and for a key or table set twice (`Cannot overwrite a value`, `Cannot
    declare ('vllm',) twice`, `.. immutable namespace`) the line's key or header: its place
    alone (often `at end of document`) named neither, and a person looked for a typo."""
    if not any(w in message for w in ("Cannot overwrite", "twice", "immutable namespace")):
        return message
    at = re.search(r"\(at line (\d+), column \d+\)", message)
    lines = [line for line in text.splitlines()[:int(at[1]) if at else None] if line.strip()]
    if not lines:
        return message
    line = lines[-1].strip()  # (`a = 1` twice on the last lines: the place is the document's end)
    name = line if line.startswith("[") else line.partition("=")[0].strip()
    return (f"{message}: {name!r} on that line is set twice in this file (as a key, a "
            "table, or a dotted key or inline table of one); keep one of them")


def from_dict(data: Mapping[str, object], path: str = "<config>") -> Config:
    """Validate a parsed TOML document into a Config; one ConfigError lists all problems."""
    problems = _unknown(data.keys(), (*SECTIONS.keys(), *ARRAYS), "", "section")
    sections: dict[str, object] = {}
    for name, cls in SECTIONS.items():
        table = data.get(name, {})
        if not isinstance(table, dict):
            tables = isinstance(table, list) and table and all(isinstance(t, dict) for t in table)
            got = f"[[{name}]], an array of tables" if tables else show(table)
            problems.append(Problem(name, f"expected a table [{name}], got {got}" + (
                f"; write [{name}] with one pair of brackets: the section is one table"
                if tables else "")))
            table = {}
        sections[name] = _section(cls, table, name, problems)
    arrays: dict[str, object] = {}
    if "smoke" in data:  # imported only when configured (the daemon's import count)
        from vllmwatch.config import smoke
        arrays["smoke"], more = smoke.parse(data["smoke"])
        problems += more
    config = Config(path=path, **sections, **arrays)  # type: ignore[arg-type]
    if "adapters" in data:  # imported only when configured; checked with [vllm] and [lora]
        from vllmwatch.config import adapters
        parsed, more = adapters.parse(data["adapters"], config)
        config = dataclasses.replace(config, adapters=parsed)
        problems += more
    # A key already refused keeps its default: never also "missing" (vllm.model = "/m\0").
    refused = {p.key for p in problems}
    problems += [p for p in cross_checks(config)  # (nor a key of a section refused whole)
                 if p.key not in refused and p.key.partition(".")[0] not in refused]
    if problems:
        # Report the refused flags too, so that one edit cycle fixes the whole file.
        vllm = data.get("vllm")
        if isinstance(vllm, dict):
            args = config.vllm.args or valid_args(vllm.get("args"))
            problems += flags.args_problems(args, config.vllm.extra_args)
    raise_all(path, problems)
    return config


def _section(cls: type, table: dict[str, object], section: str, problems: list[Problem]
             ) -> object:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    problems += _unknown(table.keys(), fields.keys(), section + ".", "key")
    values = {}
    for name, value in table.items():
        if name not in fields:
            continue
        meta = fields[name].metadata
        key = f"{section}.{name}"
        try:
            values[name] = _convert(meta["kind"], value, key, meta)
        except _Refused as exc:
            problems.append(exc.problem)
    return cls(**values)


def _unknown(got: Any, known: Any, prefix: str, what: str) -> list[Problem]:
    out = []
    for name in got:
        if name not in known and prefix and name in (*SECTIONS, *ARRAYS):
            # TOML's trap: `smoke = [..]` below [vllm] is vllm.smoke (the guess was vllm.model)
            table = f"[[{name}]] tables" if name in ARRAYS else f"a [{name}] table"
            out.append(Problem(prefix + name, f"{name} is a section of its own, not one of "
                               f"[{prefix[:-1]}]'s keys (a line below the [{prefix[:-1]}] "
                               f"header belongs to it); write it as {table}, or above the "
                               "first header"))
        elif name not in known:
            problem = unknown(prefix, name, sorted(known), what)
            if prefix == "vllm." and not same_key(nearest(name, known) or "", name):
                # `max-model-len = 4096` right below [vllm]: a flag of vLLM's, one table up
                # (not `env-file`: [vllm]'s env_file by another spelling, said just before)
                problem = Problem(problem.key, f"{problem.problem} (a vLLM flag goes under "
                                  f"[vllm.args]: {cut_name(name)} = ... below that header)")
            out.append(problem)
    return out


class _Refused(Exception):
    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.problem)
        self.problem = problem


def _convert(kind: str, value: object, key: str, meta: Mapping[str, Any]) -> object:
    converter, accepted = CONVERTERS[kind]
    bounds = bounds_of(kind, meta)
    wanted = accepted if kind != "choice" else "one of " + ", ".join(
        repr(c) for c in meta["choices"])
    if bounds is not None:
        wanted += f"; accepted: {bounds.describe()}"
    try:
        out = converter(value) if kind != "choice" else choice(value, meta["choices"])
    except (ValueError, TypeError, OverflowError) as exc:
        detail = f" ({exc})" if str(exc) and "not a" not in str(exc) else ""
        raise _Refused(Problem(key, f"bad value {show(value)}{detail}; expected {wanted}")
                       ) from None
    if bounds is not None and isinstance(out, (int, float)):
        why = bounds.problem(float(out))
        if why is not None:
            raise _Refused(Problem(key, f"bad value {show(value)}: {why}; expected {wanted}"))
    return out
