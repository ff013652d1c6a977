"""Pure: a draft config -> TOML text, a comment above every line that init changed."""

from __future__ import annotations

import json
import math
import re
import textwrap

from vllmwatch.migrate.draft import Draft, Entry

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+\Z")  # \Z: "$" also matches before a final "\n"
_VLLM_ORDER = ("command", "model", "served_model_name", "host", "port", "gpus",
               "api_key_file", "env_file")


def _quoted(text: str) -> str:
    # JSON's escapes are TOML basic-string escapes, but not its surrogate pairs (hence
    # ensure_ascii=False), and TOML also refuses a raw DEL.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def key(name: str) -> str:
    """A TOML key: bare when it can be, quoted otherwise (a dotted flag name)."""
    return name if _BARE_KEY.match(name) else _quoted(name)


def value(v: object) -> str:
    """A TOML value (inline tables for JSON objects)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else "nan" if math.isnan(v) \
            else repr(v)
    if isinstance(v, str):
        return _quoted(v)
    if isinstance(v, list):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, dict):
        if not v:
            return "{}"
        return "{ " + ", ".join(f"{key(str(k))} = {value(x)}" for k, x in v.items()) + " }"
    if v is None:
        return '""'
    return _quoted(str(v))


def comment(text: str, indent: str = "") -> list[str]:
    """Comment lines, wrapped at 96 columns; control characters shown escaped."""
    clean = "".join(c if (c >= " " and c != "\x7f") or c == "\t" else repr(c)[1:-1]
                    for c in text)
    return [f"{indent}# {line}" for line in textwrap.wrap(clean, 94, break_long_words=False,
                                                         break_on_hyphens=False)] or []


def render(draft: Draft, source: str) -> str:
    """The whole file."""
    lines = [*comment(f"Written by `vllmwatch init` from: {source}"),
             *comment("A comment above a line says what the line had and why it changed; "
                      "lines that vLLM would refuse are commented out. The defaults of every "
                      "other key are in etc/vllmwatch.toml and docs/OPERATIONS.md."),
             "", "[vllm]"]
    keys = [k for k in _VLLM_ORDER if k in draft.vllm] + [
        k for k in draft.vllm if k not in _VLLM_ORDER]
    for name in keys:
        lines += comment(draft.vllm_notes.get(name, ""))
        lines.append(f"{name} = {value(draft.vllm[name])}")
    if draft.extra_args:
        lines += comment("flags with several values, passed as they were")
        lines.append(f"extra_args = {value(draft.extra_args)}")
    if draft.env:
        lines += ["", "[vllm.env]"]
        for name, v in draft.env.items():
            lines += comment(draft.env_notes.get(name, ""))
            lines.append(f"{key(name)} = {value(v)}")
    lines += ["", "[vllm.args]"]
    for note in draft.dropped:  # words that belong to no flag: no line to comment out
        lines += comment(note)
    for entry in draft.args:
        lines += _entry(entry)
    for section, table in draft.sections.items():
        lines += ["", f"[{section}]"]
        for name, (setting, note) in table.items():
            lines += comment(note)
            lines.append(f"{key(name)} = {value(setting)}")
    for check, note, active in draft.smoke:  # checks before READY (docs/operations/smoke.md)
        lines += ["", *comment(note)]
        body = ["[[smoke]]", *(f"{key(k)} = {value(v)}" for k, v in check.items())]
        lines += body if active else [f"# {line}" for line in body]
    return "\n".join(lines) + "\n"


def _entry(entry: Entry) -> list[str]:
    out = comment(entry.note)
    text = f"{key(entry.key)} = {value(entry.value)}"
    if not entry.active:
        text = "# " + text if entry.value is not None else f"# {key(entry.key)} (dropped)"
        if "\n" in text:
            text = text.replace("\n", "\\n")
    out.append(text)
    return out
