"""Pure: init's one rule for a flag of the line that vLLM would refuse.

Such a flag is dropped, never the line: it is written commented out in [vllm.args], with a
comment that names it as the line had it, says why vLLM refuses it and what to write
instead, and an `error:` line says the same; the rest of the line is migrated and init exits
0. The line never served as written (vLLM stopped at its parser), so there is no behaviour of
that flag to keep, and the rest is what the person meant. vLLM's own flag list judges the
flag where it is known; else config/flagnames' two rules, which hold in every vLLM we know
(the loader applies the same ones, so init never writes a file its own load refuses).

The exception, where init writes nothing and exits 2: a refused form of a flag that says how
clients reach the server (CLIENT: the API key, and vllmwatch's own model, host, port and
served model name) that gives, or was meant to give, a value (`--API-KEY K`, `--PORT 8001`,
`--port` with $PORT unset). Dropped, the config would serve with no key, on another address,
under another name or another model, which the person learns only from their clients (or
never, for a key); no value can be guessed. Their `--no-` form means no value and is dropped
like any other. So is a secret the line gave that init cannot carry (envwords: several API
keys, a line break; translate: a dash-led word after a secret flag, which argparse took for a
flag): a refusal of the value, not of a flag. A value that is, or may be, a secret is never
shown: not in the comment, not on the commented-out line, not in a message (a misspelt
`--HF-TOKEN T` is dropped, T nowhere).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllmwatch.config import flags
from vllmwatch.config.flagnames import BARE_OK, TAKES_VALUE, VALUE_FLAGS, is_lowercase, spelled
from vllmwatch.config.redact import is_secret_name
from vllmwatch.config.vllmflags import FlagSet
from vllmwatch.migrate.draft import Draft, Entry
from vllmwatch.migrate.envwords import holds_secret
from vllmwatch.migrate.flagwords import Given, whole

# vllmwatch's own [vllm] keys, from the line's flags
OWNED = {"model": "model", "port": "port", "host": "host",
         "served-model-name": "served_model_name"}
# How clients reach the server: a refused form of one of these that carries a value stops init
CLIENT = frozenset({*OWNED, "api-key"})


@dataclass(frozen=True)
class Refused:
    """Why vLLM refuses a flag of the line (our words), what to write instead, and the flag
    it most likely meant (for CLIENT)."""

    why: str
    todo: str
    meant: str


def meant(name: str, known: FlagSet | None) -> str:
    """The flag a name the parser refuses most likely meant (`API-K` -> api-key)."""
    return whole(spelled(name), known) if spelled(name) else name


def judge(given: Given, known: FlagSet | None) -> Refused | None:
    """Why vLLM refuses this flag by its name or its shape (wrong case, the --no- form of a
    value flag, a value flag given bare), or None. A flag unknown to the list, or a value its
    reader refuses, is judged where it is typed (translate._typed), as before."""
    name, base = given.name, given.name.partition(".")[0]
    if not is_lowercase(base):
        good = meant(base, known)
        return Refused(f"vLLM has no flag `--{base}`: its flags are lowercase words joined "
                       "by - and its parser matches them exactly (it refused this line: "
                       "`unrecognized arguments`)",
                       f"write `--{good}` on the line" if good != base else "remove it", good)
    if base != name:
        return None
    negated = name[3:] if name.startswith("no-") else ""
    if negated and _negates_value_flag(name, negated, known):
        return Refused(f"`--{negated}` takes a value and only switches have a `--no-` form "
                       "(vLLM refused this line: `unrecognized arguments`)", "leave it out to "
                       f"keep `--{negated}` at vLLM's default, or give `--{negated}` a value",
                       negated)
    if [w.lower() for w in given.values] in (["true"], ["false"]) and (_takes_value(
            name, known) or (known is not None and known.kind(name) == "text")):
        return Refused(f"`--{name}` takes a value, not a switch's {given.values[0]} (a guide's "
                       "word for a switch: vLLM refuses it for a number, and vllmwatch's load "
                       "for any flag)", f"{_write(name)}, or leave it out for vLLM's default", name)
    if not given.values and "=" not in given.raw and _takes_value(name, known) and \
            name not in BARE_OK:
        return Refused(f"no value on the line, and `--{name}` takes one (vLLM refused this "
                       "line: `expected one argument`; a number right before > or >> is a file "
                       "descriptor to sh, and an unset variable leaves nothing)",
                       _write(name) if name not in OWNED else
                       "give its value on the line (is the variable that held it set?)",
                       name)
    return None


def _write(name: str) -> str:
    """What to write for a flag's value (a secret flag's `name = VALUE` reads to the redactor
    as its value: said another way)."""
    if name in flags.SECRET_FLAGS:
        return f"give `--{name}` its value on the line"
    return f"write `{name} = VALUE` in [vllm.args]"


def _negates_value_flag(name: str, negated: str, known: FlagSet | None) -> bool:
    """`--no-X` where X takes a value (a text one too: only a switch has a --no- form)."""
    if known is not None:
        return name not in known.flags and known.kind(negated) not in (None, "bool")
    return _takes_value(negated, known) or negated in flags.SECRET_FLAGS


def _takes_value(name: str, known: FlagSet | None) -> bool:
    """A flag that takes a value: vllmwatch's own, or vLLM's list says so (a number or JSON:
    a text flag may be `bool | str`, bare in vLLM), else every vLLM we know takes one for it.
    (--api-key's own words, bare or not, are envwords.secret_flag's.)"""
    if name in OWNED:
        return True
    if name == "api-key":
        return False
    if known is not None:
        return known.kind(name) in ("number", "json")
    return name in TAKES_VALUE or name in VALUE_FLAGS or name in flags.BUILTIN_JSON


def secret(given: Given, known: FlagSet | None) -> bool:
    """Whether the flag's value is, or may be, a secret: a secret flag by any spelling, a
    name or a value the redactor would hide."""
    base = given.name.partition(".")[0]
    return meant(base, known) in flags.SECRET_FLAGS or is_secret_name(base) or any(
        holds_secret("", v) for v in given.values)


def shown(given: Given, known: FlagSet | None) -> str:
    """The flag as the line had it, in backticks: its value left out where it may be a
    secret (no redactor's `<redacted>` here: the comment goes in the file as it is)."""
    if not secret(given, known) or not given.values:
        return f"`{given.raw}`"
    word = given.raw.split(" ", 1)[0].partition("=")[0]
    return f"`{word}` (its value not shown: it may be a secret)"


def apply(given: Given, refused: Refused, draft: Draft, known: FlagSet | None,
          note: str = "") -> None:
    """The rule: drop the flag with a comment and an error, or, for CLIENT with a value
    meant, refuse the line (draft.fatal: nothing written)."""
    what = shown(given, known)
    if refused.meant in CLIENT and not given.name.startswith("no-"):
        lost = {"api-key": "every client with no key, not with the key the line meant",
                "port": "on vLLM's default port, not the one the line meant",
                "host": "on every interface, not only the address the line meant",
                "model": "no model, or another one", "served-model-name":
                "under the model's path, and clients calling the name would get 404"
                }[refused.meant]
        draft.fatal.append(f"{what}: {refused.why}. init drops such a flag, but this one says "
                           f"how clients reach the server: without it the config would serve "
                           f"{lost}; {refused.todo}, then run init again")
        return
    draft.errors.append(f"{what}: {refused.why}; dropped: {refused.todo}")
    draft.arg(Entry(given.name, None, f"{note}the line had {what}: {refused.why}; dropped: "
                    f"{refused.todo}", False))


def refuse(given: Given, value: object, why: str, draft: Draft, known: FlagSet | None,
           note: str = "") -> None:
    """A flag (or its value) vLLM's list refuses: commented out as written, so that fixing it
    is an edit; a value that may be a secret is never written, even commented out."""
    if secret(given, known):
        draft.errors.append(f"{shown(given, known)}: {why}")
        draft.arg(Entry(given.name, None, f"{note}the line had {shown(given, known)}: {why} "
                        "(`run` would refuse it)", False))
        return
    draft.refuse(given.raw, given.name, value, why, note)
