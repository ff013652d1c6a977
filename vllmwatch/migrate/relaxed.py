"""Pure: the JSON-ish values guides print (`{type:dynamic,factor:4.0}`, single quotes, a
value the shell's brace expansion split in two) read as the JSON they mean, and the removed
rope flags turned into the hf-overrides that replaces them, and --shutdown-timeout into
restart.drain_timeout."""

from __future__ import annotations

import contextlib
import json
import os
import re

from vllmwatch.config import units
from vllmwatch.config.bounds import DAY  # restart.drain_timeout's bound
from vllmwatch.migrate.draft import Draft, Entry, Facts
from vllmwatch.migrate.flagwords import Given, refused_value

_BARE = re.compile(r"(?<=[{\[,:])\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*(?=[:,}\]])")
_LITERALS = {"true", "false", "null"}


def loads(text: str) -> object:
    """JSON, or the JSON a person meant: bare keys and words quoted, ' as ", True/False/None
    as JSON's. Raises ValueError when it is neither."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    fixed = text.strip().replace("'", '"')
    fixed = re.sub(r"\b(True|False|None)\b",
                   lambda m: {"True": "true", "False": "false", "None": "null"}[m.group(1)],
                   fixed)

    def quote(match: re.Match[str]) -> str:
        word = match.group(1)
        return word if word in _LITERALS or _is_number(word) else json.dumps(word)

    return json.loads(_BARE.sub(quote, fixed))


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _text_of(value: object) -> str:
    """The value as one text; words that brace expansion split (`{a:1,b:2}` became
    `a:1 b:2`) are put back together."""
    if isinstance(value, list):
        return "{" + ",".join(str(v) for v in value) + "}"
    return str(value)


def parse(given: Given, value: object) -> tuple[object | None, str]:
    """(the JSON value or None, what was wrong with the line's text or '')."""
    text = _text_of(value)
    try:
        return json.loads(text), ""
    except ValueError:
        pass
    try:
        got = loads(text)
    except ValueError as exc:
        return None, f"not JSON even read loosely ({exc})"
    split = " (the shell's brace expansion had split it)" if isinstance(value, list) else ""
    return got, f"{text!r} is not JSON{split}; written as the table it means"


def json_flag(given: Given, value: object, draft: Draft, facts: Facts, note: str) -> None:
    """A flag that takes JSON: written as a TOML table (vllmwatch passes it as JSON)."""
    if (facts.known and (facts.known.parsers or {}).get(given.name, "").startswith("object")):
        with contextlib.suppress(ValueError):  # (1.5K: left for the refusal below to name)
            value = units.expand_suffixes(_text_of(value))  # vLLM expands 80m in its JSON
    got, why = parse(given, value)
    if got is None:
        draft.errors.append(f"{given.raw}: {why}")
        draft.arg(Entry(given.name, _text_of(value), f"{note}the line had `{given.raw}`: "
                        f"{why}; fix it and uncomment", False))
        return
    if (refused := refused_value(given.name, got, facts.known)) is not None:
        draft.refuse(given.raw, given.name, got, refused, note)  # (a key its class lacks)
        return
    moved: list[str] = []
    got = absolute_within(got, facts, given.name, moved)
    where = (f"{', '.join(moved)} relative to {facts.cwd}; the service starts elsewhere"
             if moved else "")  # (as translate._absolute says it of a flag's own value)
    if _has_null(got):  # TOML has no null: a table would change it (to ""); kept as JSON
        draft.extra_args += [f"--{given.name}", json.dumps(got, separators=(",", ":"))]
        draft.said.append(f"--{given.name} holds a JSON null, which TOML cannot write: "
                          "kept in vllm.extra_args as JSON" + (f"; {where}" if where else ""))
        return
    told = [t for t in (where, why and f"the line had `{given.raw}`: {why}") if t]
    draft.arg(Entry(given.name, got, note + "; ".join(told)))


def absolute_within(value: object, facts: Facts, key: str, moved: list[str]) -> object:
    """A JSON value with each path in it relative to the line's folder made absolute, as
    translate._absolute does for a flag's own value: vLLM opens `--speculative-config
    '{"model": "./draft"}'`, a compilation cache_dir, from the service's WorkingDirectory.
    A string is a path when it begins ./ or ../, or names with a / what is there (a hub id,
    `org/name`, is not); `moved` gets "KEY 'was'" for each."""
    if isinstance(value, dict):
        return {k: absolute_within(v, facts, f"{key}.{k}", moved) for k, v in value.items()}
    if isinstance(value, list):
        return [absolute_within(v, facts, f"{key}[{i}]", moved) for i, v in enumerate(value)]
    if not isinstance(value, str) or not facts.cwd or value.startswith("/") or not (
            value.startswith(("./", "../")) or ("/" in value and facts.exists(
                os.path.join(facts.cwd, value)))):
        return value
    moved.append(f"{key} {value!r} was")
    return os.path.normpath(os.path.join(facts.cwd, value))


def absolute_text(value: str, facts: Facts, key: str, moved: list[str]) -> str:
    """A flag's text with the paths in it made absolute: JSON text (`--lora-modules '{"name":
    "a", "path": "./a"}'`) walked by absolute_within, the path of `NAME=./path` (`--lora-modules
    a=./a`: vLLM loaded the adapter from its WorkingDirectory, and failed its start)."""
    if not facts.cwd:
        return value
    if value.lstrip()[:1] in ("{", "["):
        try:
            got = json.loads(value)
        except ValueError:
            return value
        before = len(moved)
        got = absolute_within(got, facts, key, moved)
        return json.dumps(got) if len(moved) > before else value
    name, eq, path = value.partition("=")
    if not eq or not name or "/" in name or not path.startswith(("./", "../")):
        return value
    moved.append(f"{key} {value!r} was")
    return f"{name}={os.path.normpath(os.path.join(facts.cwd, path))}"


def _has_null(value: object) -> bool:
    if isinstance(value, dict):
        return any(_has_null(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_null(v) for v in value)
    return value is None


def rope(given: Given, value: object, draft: Draft) -> None:
    """--rope-scaling / --rope-theta (removed from vLLM) -> hf-overrides.rope_parameters."""
    got, why = parse(given, value) if given.name == "rope-scaling" else (value, "")
    current = next((e for e in draft.args if e.key == "hf-overrides"), None)
    overrides = dict(current.value) if current and isinstance(current.value, dict) else {}
    params = dict(overrides.get("rope_parameters") or {})
    if given.name == "rope-theta":
        try:
            params["rope_theta"] = float(str(value))
        except ValueError:
            got = None
    elif isinstance(got, dict):
        params.update({("rope_type" if k == "type" else k): v for k, v in got.items()})
    if got is None:
        draft.errors.append(f"{given.raw}: cannot read the value ({why}); not written")
        draft.arg(Entry(given.name, None, f"the line had `{given.raw}`: removed from "
                        "vLLM and unreadable; see hf-overrides", False))
        return
    overrides["rope_parameters"] = params
    note = (f"the line had `{given.raw}`: --{given.name} was removed from vLLM; "
            "hf-overrides.rope_parameters replaces it")
    if current and current.note:
        note = current.note + "; " + note
    draft.arg(Entry("hf-overrides", overrides, note))


def injected(given: Given, value: object, draft: Draft, supervised: bool) -> bool:
    """A flag vllmwatch passes itself (config/launch.INJECTED_FLAGS). --shutdown-timeout N ->
    restart.drain_timeout = N, the figure vllmwatch passes it from and drains by, so that the
    service lets requests in flight finish as long as the line's vLLM did (kept as a flag, a
    drain past restart.stop_timeout was cut by its SIGKILL; dropped from a vLLM that an
    earlier vllmwatch supervised, the new one drained 30 s whatever the old figure). False:
    a word vLLM's int() refuses on a hand-run line, left to the flag's usual path."""
    text = str(value).strip()
    if given.name != "shutdown-timeout" or not (text.isascii() and text.isdigit()
                                                and int(text) <= DAY):
        if supervised:  # the old vllmwatch's own word: dropped, as before
            draft.arg(Entry(given.name, None, f"the line had `{given.raw}`: dropped: a "
                            "vllmwatch added it; the new one adds it itself", False))
        return supervised
    who = "the vllmwatch that supervised this vLLM passed" if supervised else "the line gave"
    draft.put("restart", "drain_timeout", int(text), f"`{given.raw}`, which {who} vLLM: "
              "vllmwatch passes it as --shutdown-timeout and drains that long before a restart")
    draft.arg(Entry(given.name, None, f"the line had `{given.raw}`: moved to "
                    "restart.drain_timeout (vllmwatch passes --shutdown-timeout itself)", False))
    return True
