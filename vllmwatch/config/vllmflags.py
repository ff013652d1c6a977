"""The flags the configured vLLM accepts, asked of vLLM itself once and cached per version.

Building `vllm serve`'s argument parser imports torch (seconds), so it runs once in a
subprocess of vLLM's own interpreter; the answer is cached on disk per vLLM version and
executable, in a directory only we can write. When vLLM cannot be asked (not installed,
too slow, an unknown layout), callers warn and carry on: this check never blocks a start.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vllmwatch.config import flags, safefile, vllminfo
from vllmwatch.config.errors import Problem
from vllmwatch.config.schema import Config

ASK_TIMEOUT_S = 120.0  # importing torch on a loaded 2-core box took 38 s
# How long a failed ask stands for the daemon's launches (known_flags' retry_after): each ask
# imports torch for up to ASK_TIMEOUT_S beside the vLLM being started; `check` asks anyway
RETRY_FAILED_S = 3600.0
_MARK = "VLLMWATCH_FLAGS "
# What vLLM's parser says of each flag: a script run by vLLM's interpreter (`-c`: its folder
# never joins sys.path), never imported by vllmwatch.
_PROBE_FILE = Path(__file__).with_name("vllm_flag_probe.py")
# What the probe's answer holds, raised when it learns more (2: `jsonobj`, a json.loads flag
# whose field is a dict): a cache of another format is used until vLLM is asked again
PROBE_FORMAT = 2


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


def _cache_path(command: list[str] | tuple[str, ...], version: str | None,
                cache_dir: str | None) -> tuple[str | None, str | None]:
    """(this vLLM's interpreter, its cache file without .json) per version and interpreter."""
    python = vllminfo.interpreter(command)
    if version is None or python is None:
        return python, None
    key = hashlib.sha256(f"{version}\0{python}".encode()).hexdigest()[:16]
    directory = safefile.private_dir(cache_dir) if cache_dir else None
    return python, os.path.join(directory, key) if directory else None


def failed_ask(command: list[str] | tuple[str, ...], version: str | None,
               cache_dir: str | None, within: float = RETRY_FAILED_S) -> tuple[float, str] | None:
    """(when, why) of the last ask of this vLLM that failed, if less than `within` s ago."""
    base = _cache_path(command, version, cache_dir)[1]
    text = safefile.read_private(base + ".failed") if base else None
    try:
        got = json.loads(text or "null")
        at, why, of = float(got["at"]), str(got["why"]), got["version"]
    except (ValueError, KeyError, TypeError):
        return None
    return (at, why) if of == version and 0 <= time.time() - at < within else None


def known_flags(command: list[str] | tuple[str, ...], version: str | None,
                cache_dir: str | None, *, ask: bool = True, timeout: float = ASK_TIMEOUT_S,
                retry_after: float | None = None) -> FlagSet | None:
    """The flags of the vLLM that `command` runs; None when they cannot be learnt. With
    ask=False only the cache is consulted (for fast checks); with retry_after, vLLM is not
    asked again within that many seconds of an ask that failed (the daemon's launches)."""
    python, base = _cache_path(command, version, cache_dir)
    if version is None or python is None:
        return None
    path = base + ".json" if base else None
    cached = _read(path, version) if path else None
    # An entry of an older vllmwatch lacks kinds, lists or readers: usable (the built-in JSON
    # list stands in, values judged loosely), replaced by a full answer whenever vLLM may be asked.
    if (cached is not None and cached.complete) or not ask or (
            retry_after is not None and failed_ask(command, version, cache_dir, retry_after)):
        return cached
    got = _ask(python, version, timeout)
    if base is not None:  # a failure is remembered (its why), an answer forgets it
        if isinstance(got, str):
            safefile.write_private(base + ".failed", json.dumps(
                {"version": version, "at": time.time(), "why": got}))
        else:
            with contextlib.suppress(OSError):
                os.unlink(base + ".failed")
    if isinstance(got, str):
        return cached
    if path is not None:
        fields = {"lists": got.lists, "integers": got.integers}  # (None: not given)
        safefile.write_private(path, json.dumps({
            "version": version, "probe": PROBE_FORMAT, "flags": sorted(got.flags),
            "switches": sorted(got.switches),
            "kinds": dict(sorted(got.kinds.items())), "aliases": dict(got.aliases),
            **{k: sorted(v) for k, v in fields.items() if v is not None},
            **{k: dict(v) for k, v in (("choices", got.choices), ("parsers", got.parsers),
                                       ("fields", got.fields)) if v is not None}}))
    return got


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
        if data.get("probe") != PROBE_FORMAT:  # another probe's: its JSON flags took any JSON
            data.pop("fields", None)  # where a dict's field takes an object: asked again
        return FlagSet(version, frozenset(data["flags"]), frozenset(data["switches"]),
                       {str(k): str(v) for k, v in kinds.items()},
                       {str(k): str(v) for k, v in dict(aliases).items()},
                       frozenset(map(str, lists)) if isinstance(lists, list) else None,
                       *_integers_choices(data))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _ask(python: str, version: str, timeout: float) -> FlagSet | str:
    """vLLM's answer, or why there is none (a few words, never vLLM's output)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    try:
        out = subprocess.run([python, "-I", "-c", _PROBE_FILE.read_text(), _MARK,
                              str(os.getpid())],  # (it dies with us: vllm_flag_probe.py)
                             capture_output=True, text=True,
                             timeout=timeout, check=False, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout:g} s"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{python} could not run ({type(exc).__name__})"
    for line in out.stdout.splitlines():
        if line.startswith(_MARK):
            with contextlib.suppress(ValueError):
                got = _from_probe(version, json.loads(line[len(_MARK):]))
                if got is not None:
                    return got
            return "an answer it could not read"
    return f"no answer (exit {out.returncode}: not installed for {python}, or a layout this " \
        "vllmwatch does not know)"


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
    from vllmwatch.config import flagvalues  # (judged only where a flag list is known)
    return flagvalues.validate_args(config, known)


def flag_problem(name: str, value: object, key: str, known: FlagSet) -> Problem | None:
    """Why this vLLM refuses one flag and value (unknown, with a did-you-mean), or None."""
    from vllmwatch.config import flagvalues
    return flagvalues.flag_problem(name, value, key, known)


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
