"""Why vLLM's reader of one flag refuses the word it is given: the reader its probe names
(config/vllm_flag_probe.py: int, float, human_readable_int, a JSON reader, --lora-modules'
action, ...), the flag's choices and the keys a JSON flag's config class takes. Apart from
vllmflags (which asks vLLM and caches the answer) and imported by it only when a flag list
is known."""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from typing import Protocol

from vllmwatch.config import units
from vllmwatch.config.convert import show
from vllmwatch.config.errors import Problem


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
    return (known.parsers or {}).get(base, "").removesuffix("?") in (
        "json", "object", "dict_or_str", "lora")


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
