"""Pure: the JSON-ish values guides print (`{type:dynamic,factor:4.0}`, single quotes, a
value the shell's brace expansion split in two) read as the JSON they mean, and the removed
rope flags turned into the hf-overrides that replaces them."""

from __future__ import annotations

import json
import re

from vllmwatch.migrate.draft import Draft, Entry
from vllmwatch.migrate.flagwords import Given

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


def json_flag(given: Given, value: object, draft: Draft, note: str) -> None:
    """A flag that takes JSON: written as a TOML table (vllmwatch passes it as JSON)."""
    got, why = parse(given, value)
    if got is None:
        draft.errors.append(f"{given.raw}: {why}")
        draft.arg(Entry(given.name, _text_of(value), f"{note}the line had `{given.raw}`: "
                        f"{why}; fix it and uncomment", False))
        return
    if _has_null(got):  # TOML has no null: a table would change it (to ""); kept as JSON
        draft.extra_args += [f"--{given.name}", json.dumps(got, separators=(",", ":"))]
        draft.said.append(f"--{given.name} holds a JSON null, which TOML cannot write: "
                          "kept in vllm.extra_args as JSON")
        return
    draft.arg(Entry(given.name, got, f"{note}the line had `{given.raw}`: {why}" if why
                    else note))


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
