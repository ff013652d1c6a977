"""Pure: the words after `vllm serve` -> the model and the flags as given, argparse-like.

Which words belong to a flag depends on its kind (a switch takes none, except the `True` or
`False` guides write after one); the flag list of the installed vLLM says it, else we guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllmwatch.config import flagnames, vllmflags
from vllmwatch.config.flagnames import NUMBER_LISTS as _NUMBER_LISTS
from vllmwatch.config.flagnames import ONE_WORD as _ONE_WORD
from vllmwatch.config.flagnames import SWITCHES, spelled
from vllmwatch.config.flagnames import VALUE_FLAGS as VALUE_FLAGS
from vllmwatch.config.flags import DASHES, SECRET_FLAGS, flag_name, long_form
from vllmwatch.config.serveline import is_number
from vllmwatch.config.vllmflags import FlagSet

# vLLM's short flags, for when its flag list is not known (the list's aliases win).
_BOOL_WORDS = ("true", "false")


@dataclass(frozen=True)
class Given:
    """One flag as the line had it: its long name, its value words (none for a bare
    switch) and the words themselves, for the comment that says what the line had."""

    name: str
    values: tuple[str, ...]
    raw: str


@dataclass(frozen=True)
class Words:
    """The positional model (or None), the flags in order, words that fit nowhere (quoted,
    as shown), and the secret flags whose next word fits nowhere (that word is never shown:
    a key that starts with a dash is a flag to argparse)."""

    model: str | None
    flags: tuple[Given, ...]
    stray: tuple[str, ...]
    hidden: tuple[str, ...] = ()


def _is_flag(word: str) -> bool:
    """As argparse reads a word: a dash starts a flag, except a negative number and a word
    with a space before any `=` (`--api-key '-my key'` serves the key `-my key`)."""
    if " " in word.partition("=")[0]:
        return False
    return (word.startswith("-") and len(word) > 1 and not is_number(word)) or (
        word[:1] in DASHES and word[1:2].isalpha())


def whole(name: str, known: FlagSet | None) -> str:
    """The flag an abbreviation names, as vLLM's parser reads it (a unique prefix of a flag:
    --max-model is --max-model-len); a prefix of a secret flag is that flag, so that its
    value never lands in the TOML (`--api-k KEY`, which vLLM takes as --api-key)."""
    if "." in name or (known is not None and name in known.flags):
        return name
    found = [f for f in known.flags if f.startswith(name)] if known is not None else []
    if len(found) == 1:
        return found[0]
    # (vLLM refuses a prefix that is not unique: the line did not run; its secret still
    # stays out of the TOML. Three letters at least: `--h` is not taken for --hf-token.)
    secret = [f for f in SECRET_FLAGS if f.startswith(name)] if len(name) >= 3 else []
    return secret[0] if secret else name


def _short(word: str, known: FlagSet | None) -> tuple[str | None, str | None]:
    """(long name, inline value) of a short flag: -tp, -tp=2, -O3, -O=3, as the checks read
    it (flags.long_form and FlagSet.short_aliases: one reading for both)."""
    long = long_form(word, known.short_aliases if known else None)
    if long == word or not long.startswith("--"):
        return None, None
    name, eq, inline = long[2:].partition("=")
    return name, inline if eq else None


def read(rest: list[str], known: FlagSet | None) -> Words:
    """Walk the words after the program as argparse would."""
    model: str | None = None
    out: list[Given] = []
    stray: list[str] = []
    hidden: list[str] = []
    i = 0
    while i < len(rest):
        word = rest[i]
        i += 1
        if not _is_flag(word):
            # argparse gives the optional positional the first word no flag takes, before
            # the flags or after them (`vllm serve --max-model-len 2048 /m` serves /m)
            if model is None:
                model = word
            else:
                stray.append(repr(word))
            continue
        # right after a secret flag that took no word, it may be the secret itself (a key
        # that starts with a dash: argparse takes it for a flag): never shown. After the API
        # key by any spelling (`--API-KEY --Zq7`) even a long flag's word is (a bare
        # --hf-token is the cached login, and a flag after it is a flag).
        after = out[-1].name if out and not out[-1].values and out[-1].raw == rest[i - 2] \
            and whole(spelled(out[-1].name), known) in SECRET_FLAGS else None
        if word.startswith("--") or word[:1] in DASHES:
            if after is not None and whole(spelled(after), known) == "api-key":
                hidden.append(after)
                continue
            name, eq, inline = word[1 if word[:1] in DASHES else 2:].partition("=")
            value: str | None = inline if eq else None
        else:
            long, value = _short(word, known)
            if long is None:
                (hidden if after else stray).append(after or repr(word))
                continue
            name, eq = long, "=" if value is not None else ""
        name = whole(flag_name(name), known)
        if eq:
            out.append(Given(name, (value or "",), word))
            continue
        taken = _values(rest, i, _takes(name, known))
        out.append(Given(name, tuple(taken), " ".join([word, *taken])))
        i += len(taken)
    return Words(model, tuple(out), tuple(stray), tuple(hidden))


def _takes(name: str, known: FlagSet | None) -> str | None:
    """How many words a flag takes, as its kind for _values: "many" for vLLM's nargs="+"
    flags (`--cudagraph-capture-sizes 1 2 4`), "one" for another text flag when vLLM said
    which take several; a JSON flag takes the words up to the next flag (a guide's
    unquoted JSON, read loosely by migrate/relaxed.py)."""
    base = name.split(".")[0]
    kind = known.kind(base) if known else None
    if known is not None and known.lists is not None and kind != "bool" and "." not in name:
        if base in known.lists:
            return "many"
        return "one" if kind == "text" else kind
    if known is None and name in SWITCHES:  # (`vllm serve --enforce-eager /m` serves /m)
        return "bool"
    if known is None and base not in _NUMBER_LISTS and name not in _ONE_WORD:
        return "number?"  # no flag list: a number is one flag's whole value (below)
    return "one" if name in _ONE_WORD and kind != "bool" else kind


def _values(rest: list[str], i: int, kind: str | None) -> list[str]:
    """The words a flag takes: all that follow up to the next flag; a switch only takes the
    True/False a guide writes after it (vLLM itself would refuse that word)."""
    taken: list[str] = []
    while i < len(rest) and not _is_flag(rest[i]):
        if kind == "bool" and rest[i].lower() not in _BOOL_WORDS:
            break
        taken.append(rest[i])
        i += 1
        if kind in ("bool", "number", "one") or (kind == "number?" and is_number(taken[0])):
            break
    return taken


def refused_value(name: str, value: object, known: FlagSet | None) -> str | None:
    """Why vLLM refuses this value of a number or text flag (its reader, by the flag list;
    without one, an empty value of a flag that takes one), or None."""
    if known is not None:  # (kv-cache-dtype fp16 is made auto, with a note: translate._text)
        problem = None if name == "kv-cache-dtype" and isinstance(value, str) else \
            vllmflags.flag_problem(name, value, f"vllm.args.{name}", known)
        return problem.problem if problem else None
    if value == "" and name in VALUE_FLAGS:  # `--max-model-len=` ($LEN unset)
        return ("an empty value: vLLM stops on it for a number (vLLM 0.32: `invalid "
                "human_readable_int_or_auto value: ''`) and reads none for an optional "
                f"flag; write `{name} = VALUE` in [vllm.args], or leave the flag out")
    problem = flagnames.value_problem(name, value, f"vllm.args.{name}")  # (as the load judges)
    return problem.problem if problem else None
