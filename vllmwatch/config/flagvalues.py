"""Why this vLLM refuses a config's flags, judged by its flag list (config/vllmflags.py asks
vLLM for it and caches it; this module is imported by it only when a list is known): an
unknown or abbreviated flag, words after a flag of one value, and a value vLLM's own reader
of that flag refuses (the reader its probe names: int, float, human_readable_int, a JSON
reader, --lora-modules' action, ...), outside its choices, or a JSON key its class has not."""

from __future__ import annotations

import difflib
import itertools
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from vllmwatch.config import flags, units
from vllmwatch.config.convert import show
from vllmwatch.config.errors import Problem

if TYPE_CHECKING:
    from vllmwatch.config.schema import Config


class FlagSet(Protocol):
    """What the judgement reads of vllmflags.FlagSet (vllmflags imports this module: an
    import back, even for the type, would be a circle)."""

    @property
    def version(self) -> str: ...
    @property
    def flags(self) -> frozenset[str]: ...
    @property
    def switches(self) -> frozenset[str]: ...
    @property
    def kinds(self) -> Mapping[str, str]: ...
    @property
    def aliases(self) -> Mapping[str, str]: ...
    @property
    def lists(self) -> frozenset[str] | None: ...
    @property
    def integers(self) -> frozenset[str] | None: ...
    @property
    def choices(self) -> Mapping[str, tuple[str, ...]] | None: ...
    @property
    def parsers(self) -> Mapping[str, str] | None: ...
    @property
    def fields(self) -> Mapping[str, tuple[str, ...]] | None: ...
    @property
    def json_flags(self) -> frozenset[str]: ...
    @property
    def short_aliases(self) -> dict[str, str]: ...
    def kind(self, name: str) -> str | None: ...


def validate_args(config: Config, known: FlagSet) -> list[Problem]:
    """Every [vllm.args] key and extra_args flag that this vLLM does not accept."""
    names = [(flags.flag_name(k), v, f"vllm.args.{k}") for k, v in config.vllm.args.items()]
    names += _named(config.vllm.extra_args, known, "vllm.extra_args", 0)
    start = flags.command_tail(config.vllm.command)  # vLLM's flags written in the command
    if start is not None:  # (on either side of vllm.model as vLLM's positional, judged apart:
        # `vllm serve --max-model-len 4096 /m` and `--enforce-eager /m` serve /m)
        words = config.vllm.command[start:]
        cut = next((i for i, word in enumerate(words) if word == config.vllm.model
                    and _positional(words, i, known)), len(words))
        names += _named(words[:cut], known, "vllm.command", start)
        names += _named(words[cut + 1:], known, "vllm.command", start + cut + 1)
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


def _positional(words: Sequence[str], i: int, known: FlagSet) -> bool:
    """Whether vLLM reads words[i] as a positional: no long flag without = before it (its
    value), or one of this vLLM's switches, which take no word."""
    before = words[i - 1] if i > 0 else ""
    return not (before.startswith("--") and "=" not in before) or \
        flags.flag_name(before[2:]).split(".")[0] in known.switches


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
    base = name.split(".")[0]  # --compilation-config.level=3 sets one field of a JSON flag
    # (a JSON flag whose reader vLLM named is judged by it below, not by the built-in rule)
    json_flags = known.json_flags - {f for f in known.json_flags
                                     if json_reader(known, f)}
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
    if "." in name:  # vLLM makes {"level": 3} of --compilation-config.level 3: its class's keys
        first = name.split(".")[1].removesuffix("+")  # (`.key+ a,b` is a list)
        return _key_problem(base, {first: value}, key, known) if base in (known.fields or {}) \
            else None
    return read_problem(base, value, key, known)


def read_problem(base: str, value: object, key: str, known: FlagSet) -> Problem | None:
    """Why vLLM's reader of --base (and its choices) refuses the word that value becomes."""
    spec = known.parsers.get(base) if known.parsers is not None else _loose(known, base)
    if spec is None:  # a reader the probe does not know (or an optional value): not judged
        return None
    if value is True:  # `--tokenizer` last, or before another flag: argparse stops
        return Problem(key, f"--{base} takes a value in vLLM {known.version} and is given none "
                       "(true, or no word after it before the next --flag): vLLM would stop "
                       "with `expected one argument`; give it its value")
    word = json.dumps(value, separators=(",", ":")) if isinstance(value, (dict, list)) \
        else str(value)  # as the command writes a table (config/command.py)
    try:
        got = units.vllm_read(spec, word)
    except units.NotFinite:
        return Problem(key, f"--{base} {show(value)}: vLLM {known.version}'s float() reads it, "
                       "but no setting of vLLM's is nan or infinite (its range checks refuse "
                       "it, or it makes a size or a timer of it and fails at start); give a "
                       "finite number")
    except ValueError:
        none = ", or None for vLLM's default" if spec.endswith("?") else ""
        return Problem(key, f"--{base} takes {units.VLLM_READS[spec.removesuffix('?')]}{none} "
                       f"in vLLM {known.version}; {show(value)} is not one, and vLLM would stop")
    if isinstance(got, dict) and base in (known.fields or {}):
        return _key_problem(base, got, key, known)
    allowed = (known.choices or {}).get(base)
    if allowed and got is not None and str(got) not in allowed:
        close = difflib.get_close_matches(str(got), allowed, n=1, cutoff=0.6)
        return Problem(key, f"--{base} {show(value)} is not accepted by vLLM {known.version}; "
                       f"choose one of {', '.join(allowed)}"
                       + (" (or None for vLLM's default)" if spec.endswith("?") else "")
                       + (f" (did you mean {close[0]!r}?)" if close else ""))
    return None


def json_reader(known: FlagSet, base: str) -> bool:
    """Whether vLLM's probe named the JSON reader of --base (then it judges the word)."""
    return (known.parsers or {}).get(base, "").removesuffix("?") in units.JSON_READERS


def _key_problem(base: str, got: dict[str, object], key: str, known: FlagSet
                 ) -> Problem | None:
    """A JSON object's keys that vLLM's class for --base has not ("unexpected keyword
    argument": vLLM stops), each with a did-you-mean."""
    have = (known.fields or {}).get(base, ())
    unknown = [k for k in got if k not in have]
    if not unknown:
        return None
    shown = [k for k in have if not k.startswith("_")]  # (a class's own, not the user's)
    close = [c for k in unknown for c in difflib.get_close_matches(k, have, n=1, cutoff=0.75)]
    return Problem(key, f"--{base} has no key {', '.join(map(repr, unknown))} in vLLM "
                   f"{known.version} (vLLM would stop: unexpected keyword argument); "
                   + (f"did you mean {' or '.join(map(repr, close))}? " if close else "")
                   + f"its keys: {', '.join(shown[:12])}{', ...' if len(shown) > 12 else ''}")


def _loose(known: FlagSet, base: str) -> str | None:
    """A reader for an older vllmwatch's cache, which has none: loosely a number, a choice."""
    if known.kind(base) == "number":
        return "whole" if known.integers is not None and base in known.integers else "number"
    return "str" if base in (known.choices or {}) else None
