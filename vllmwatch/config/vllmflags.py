"""The flags the configured vLLM accepts, asked of vLLM itself once and cached per version.

Building `vllm serve`'s argument parser imports torch (seconds), so it runs once in a
subprocess of vLLM's own interpreter; the answer is cached on disk per vLLM version and
executable, in a directory only we can write. When vLLM cannot be asked (not installed,
too slow, an unknown layout), callers warn and carry on: this check never blocks a start.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vllmwatch.config import flags, safefile, units, vllminfo
from vllmwatch.config.convert import show
from vllmwatch.config.errors import Problem
from vllmwatch.config.schema import Config

ASK_TIMEOUT_S = 120.0  # importing torch on a loaded 2-core box took 38 s
_MARK = "VLLMWATCH_FLAGS "
# What vLLM's parser says of each flag: a script run by vLLM's interpreter (`-c`: its folder
# never joins sys.path), never imported by vllmwatch.
_PROBE_FILE = Path(__file__).with_name("vllm_flag_probe.py")


KINDS = ("bool", "number", "json", "text")


@dataclass(frozen=True)
class FlagSet:
    """The long flags (no dashes) of one vLLM version; `switches` take no value; `kinds`
    says what each flag's value is (one of KINDS; empty when cached by an older vllmwatch)."""

    version: str
    flags: frozenset[str]
    switches: frozenset[str]
    kinds: Mapping[str, str] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)  # "-tp" -> "tensor-parallel-size"
    # Flags that take several words (argparse nargs "+"): `--cudagraph-capture-sizes 1 2 4`;
    # None when cached by an older vllmwatch (not known)
    lists: frozenset[str] | None = None
    # Number flags that take whole numbers only (int, human_readable_int: `1.5` stops vLLM),
    # and the words a flag accepts (argparse choices); None when cached by an older vllmwatch
    integers: frozenset[str] | None = None
    choices: Mapping[str, tuple[str, ...]] | None = None
    # The reader of each flag's word (units.vllm_read: int, float, hr_int, ...; a flag with a
    # reader the probe does not know is absent); None when cached by an older vllmwatch
    parsers: Mapping[str, str] | None = None
    # The keys each JSON flag of a config class (and --lora-modules' JSON) takes, where vLLM
    # refuses any other; None when cached by an older vllmwatch (whose answer had no JSON
    # readers either: asked again)
    fields: Mapping[str, tuple[str, ...]] | None = None

    @property
    def complete(self) -> bool:  # a whole answer of this vllmwatch's probe (else ask again)
        return bool(self.kinds) and None not in (self.lists, self.choices, self.parsers,
                                                 self.fields)

    @property
    def short_aliases(self) -> dict[str, str]:
        """The short flags as this vLLM reads them: its own aliases, and -O (-O3, -O=3) as
        --compilation-config where it has no --optimization-level yet (the older meaning)."""
        level = {} if "optimization-level" in self.flags else {"-O": "compilation-config"}
        return {**self.aliases, **level}

    @property
    def json_flags(self) -> frozenset[str]:
        """The flags whose value is JSON: from vLLM itself, else the built-in list."""
        if not self.kinds:
            return flags.BUILTIN_JSON
        return frozenset(k for k, v in self.kinds.items() if v == "json")

    def kind(self, name: str) -> str | None:
        """bool, number, json or text for a known flag; None for an unknown one."""
        if name not in self.flags:
            return None
        if name in self.switches:
            return "bool"
        if self.kinds:
            return self.kinds.get(name, "text")
        return "json" if name in flags.BUILTIN_JSON else "text"


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
    """The flags of the vLLM that `command` runs; None when they cannot be learnt. With
    ask=False only the cache is consulted (for fast checks)."""
    python = vllminfo.interpreter(command)
    if version is None or python is None:
        return None
    key = hashlib.sha256(f"{version}\0{python}".encode()).hexdigest()[:16]
    directory = safefile.private_dir(cache_dir) if cache_dir else None
    path = os.path.join(directory, f"{key}.json") if directory else None
    cached = _read(path, version) if path else None
    # An entry of an older vllmwatch lacks kinds, lists or readers: usable (the built-in JSON
    # list stands in, values judged loosely), replaced by a full answer whenever vLLM may be asked.
    if (cached is not None and cached.complete) or not ask:
        return cached
    got = _ask(python, version, timeout)
    if got is not None and path is not None:
        fields = {"lists": got.lists, "integers": got.integers}  # (None: not given)
        safefile.write_private(path, json.dumps({
            "version": version, "flags": sorted(got.flags), "switches": sorted(got.switches),
            "kinds": dict(sorted(got.kinds.items())), "aliases": dict(got.aliases),
            **{k: sorted(v) for k, v in fields.items() if v is not None},
            **{k: dict(v) for k, v in (("choices", got.choices), ("parsers", got.parsers),
                                       ("fields", got.fields)) if v is not None}}))
    return got or cached


def spare_support(known: FlagSet | None) -> tuple[bool | None, bool | None]:
    """Whether this vLLM has --enable-sleep-mode and --uds (None: its flags are unknown):
    what the spare's plan needs of it (config/spare.py), for `check` and the daemon alike."""
    if known is None:
        return None, None
    return "enable-sleep-mode" in known.flags, "uds" in known.flags


def _read(path: str, version: str) -> FlagSet | None:
    text = safefile.read_private(path)
    if text is None:
        return None
    try:
        data = json.loads(text)
        if data["version"] != version:
            return None
        kinds, aliases = data.get("kinds", {}), data.get("aliases", {})
        if not isinstance(kinds, dict) or not all(v in KINDS for v in kinds.values()):
            kinds = {}
        lists = data.get("lists")
        return FlagSet(version, frozenset(data["flags"]), frozenset(data["switches"]),
                       {str(k): str(v) for k, v in kinds.items()},
                       {str(k): str(v) for k, v in dict(aliases).items()},
                       frozenset(map(str, lists)) if isinstance(lists, list) else None,
                       *_integers_choices(data))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _ask(python: str, version: str, timeout: float) -> FlagSet | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    try:
        out = subprocess.run([python, "-I", "-c", _PROBE_FILE.read_text(), _MARK],
                             capture_output=True, text=True,
                             timeout=timeout, check=False, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.stdout.splitlines():
        if line.startswith(_MARK):
            try:
                table = json.loads(line[len(_MARK):])
            except ValueError:
                return None
            return _from_probe(version, table)
    return None


def _from_probe(version: str, table: object) -> FlagSet | None:
    if not isinstance(table, dict) or not isinstance(table.get("kinds"), dict):
        return None
    kinds = {str(k): (v if v in KINDS else "text") for k, v in table["kinds"].items()}
    aliases, lists = table.get("aliases"), table.get("lists")
    return FlagSet(version, frozenset(kinds),
                   frozenset(k for k, v in kinds.items() if v == "bool"), kinds,
                   {str(k): str(v) for k, v in aliases.items()} if isinstance(aliases, dict)
                   else {}, frozenset(map(str, lists)) if isinstance(lists, list) else None,
                   *_integers_choices(table))


def _integers_choices(table: Mapping[str, object]) -> tuple[
        frozenset[str] | None, dict[str, tuple[str, ...]] | None, dict[str, str] | None,
        dict[str, tuple[str, ...]] | None]:
    """The probe's (or the cache's) whole-number flags, choices, readers and JSON keys (None:
    absent)."""
    ints, choices, readers = table.get("integers"), table.get("choices"), table.get("parsers")
    keys = table.get("fields")
    return (frozenset(map(str, ints)) if isinstance(ints, list) else None,
            {str(k): tuple(map(str, v)) for k, v in choices.items() if isinstance(v, list)}
            if isinstance(choices, dict) else None,
            {str(k): str(v) for k, v in readers.items()} if isinstance(readers, dict) else None,
            {str(k): tuple(map(str, v)) for k, v in keys.items() if isinstance(v, list)}
            if isinstance(keys, dict) else None)


def validate_args(config: Config, known: FlagSet) -> list[Problem]:
    """Every [vllm.args] key and extra_args flag that this vLLM does not accept."""
    names = [(flags.flag_name(k), v, f"vllm.args.{k}") for k, v in config.vllm.args.items()]
    names += _named(config.vllm.extra_args, known, "vllm.extra_args", 0)
    start = flags.command_tail(config.vllm.command)  # vLLM's flags written in the command
    if start is not None:
        names += _named(config.vllm.command[start:], known, "vllm.command", start)
    out = [p for n, v, k in names if (p := flag_problem(n, v, k, known)) is not None]
    if config.vllm.env_file:  # its flags alike, their values never shown (only then loaded)
        from vllmwatch.config.envfilechecks import known_flag_problems
        out += known_flag_problems(config, known, flag_problem)
    return out


def _named(words: Sequence[str], known: FlagSet, where: str, offset: int
           ) -> list[tuple[str, object, str]]:
    """(flag name, value, key) of each flag in an argv list, and ("", the extra words, key)
    after a flag of one value (the words vLLM refuses)."""
    out: list[tuple[str, object, str]] = []
    extra = flags.long_forms(words, known.short_aliases)
    for i, token in enumerate(extra):
        if token.startswith("--"):
            name, eq, inline = token[2:].partition("=")
            value = inline if eq else flags.next_value(extra, i)
            key = f"{where}[{i + offset}]"
            out.append((flags.flag_name(name), value, key))
            more = _words_after(extra, i + (0 if eq else 1))
            base = flags.flag_name(name).split(".")[0]
            if more and known.lists is not None and (eq or base not in known.lists) and \
                    base in known.flags and base not in known.switches:  # (--x=1 is one word)
                out.append(("", more, key))
            elif not eq and base in (known.lists or ()):  # vLLM reads each word as the first
                out += [(flags.flag_name(name), w, f"{where}[{i + offset + j}]")
                        for j, w in enumerate(more, 2)]
        elif token.startswith("-") and not units.is_number_word(token) and known.aliases and \
                not flags.is_value_of_flag(extra, i):  # a short flag this vLLM lacks (known
            # only where the flag list has its aliases: a cache of an older vllmwatch has none)
            out.append((token.partition("=")[0], None, f"{where}[{i + offset}]"))
    return out


def _words_after(extra: list[str], i: int) -> list[str]:
    """The words after extra[i] up to the next flag (`-1` is a number, not a flag)."""
    return list(itertools.takewhile(lambda w: not w.startswith("-") or units.is_number_word(w),
                                    extra[i + 1:]))


def flag_problem(name: str, value: object, key: str, known: FlagSet) -> Problem | None:
    """Why this vLLM refuses one flag and value (unknown, with a did-you-mean), or None."""
    if name.startswith("-"):  # a short flag none of this vLLM's aliases names (_named)
        return Problem(key, f"{name} is not a flag of vLLM {known.version}: vLLM would stop "
                       "with `unrecognized arguments`; write flags in full (--max-model-len)")
    if not name:  # words after a flag of one value, or one joined to its value (_named)
        return Problem(key, f"{' '.join(map(show, value)) if isinstance(value, list) else ''} "
                       f"follow a flag that takes one value in vLLM {known.version} (or with its "
                       "value after =): vLLM would stop with `unrecognized arguments`")
    from vllmwatch.config import flagvalues  # (the daemon's launch judges values only when
    # this vLLM's flags are cached: imported then)

    base = name.split(".")[0]  # --compilation-config.level=3 sets one field of a JSON flag
    # (a JSON flag whose reader vLLM named is judged by it below, not by the built-in rule)
    json_flags = known.json_flags - {f for f in known.json_flags
                                     if flagvalues.json_reader(known, f)}
    legacy = flags.flag_problem(base, value, key, known.version, json_flags)
    if legacy is not None and (base in flags.REMOVED or base in known.json_flags):
        return legacy
    if base == "compilation-config" and "optimization-level" in known.flags and \
            "." not in name and str(value).strip().isdigit() and not isinstance(value, bool):
        # -O3 meant --compilation-config 3 before --optimization-level; now a bare level
        # there stops vLLM (its JSON is a CompilationConfig)
        return Problem(key, f"--compilation-config {value} (a bare level) stops vLLM "
                       f"{known.version}, which takes the level as --optimization-level; "
                       f"write optimization-level = {value}")
    whole = [f for f in known.flags if f.startswith(base)] if base not in known.flags else []
    if len(whole) == 1:  # argparse's allow_abbrev: vLLM reads a unique prefix, we would not
        return Problem(key, f"--{base} is --{whole[0]} abbreviated: vLLM {known.version} takes "
                       "a unique prefix, but vllmwatch reads flags by their full name (the "
                       "spare's plan, the GPU memory checks, a flag set twice would miss it); "
                       f"write --{whole[0]}")
    if base not in known.flags:
        close = difflib.get_close_matches(base, sorted(known.flags), n=2, cutoff=0.75)
        hint = ("; did you mean " + " or ".join(close) + "?") if close else (
            f" (a prefix of {', '.join(sorted(whole)[:4])}{', ...' if len(whole) > 4 else ''}: "
            "vLLM stops, `ambiguous option`)" if whole else
            "; see `vllm serve --help=all` for the flags it accepts")
        return Problem(key, f"--{base} is not a flag of vLLM {known.version}{hint}")
    if value is False and f"no-{base}" not in known.flags and "." not in name:
        return Problem(key, f"--{base} has no --no-{base} form in vLLM {known.version}; "
                       "delete the key (off is the default)")
    if base in known.switches and not isinstance(value, bool) and "." not in name:
        return Problem(key, f"--{base} takes no value in vLLM {known.version}; write "
                       f"{base} = true")
    if isinstance(value, list) and "." not in name and known.kinds and known.kind(base) in (
            "number", "text"):
        # [vllm.args] writes a list as one JSON word: `--cudagraph-capture-sizes [1,2,4]`
        # stops vLLM (int("[1,2,4]")), `--numa-bind-nodes ["0","1"]` is one odd word
        if known.lists is not None and base not in known.lists:
            return Problem(key, f"--{base} takes one value in vLLM {known.version}; "
                           f"{show(value)} is a list")
        words = ", ".join(json.dumps(str(v)) for v in value[:3]) + (
            ", ..." if len(value) > 3 else "")
        return Problem(key, f"--{base} does not read JSON in vLLM {known.version}, and a list "
                       f"is written as one JSON word ({show(value)}); give its values as "
                       f'words in vllm.extra_args: ["--{base}", {words}]')
    return None if "." in name else flagvalues.read_problem(base, value, key, known)


def refusal_text(config: Config, known: FlagSet) -> str | None:
    """Why `run` refuses this config's flags (the text of its refusal), or None."""
    problems = validate_args(config, known)
    if not problems:
        return None
    lines = "; ".join(f"{p.key}: {p.problem}" for p in problems)
    return f"{config.path}: vLLM {known.version} does not accept: {lines}"


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
