"""Configs as dicts written as TOML (the daemon's config files in tests and benchmarks):
{section: {key: value}}, a section name such as "vllm.env" written as it is."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}"
                                for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def _toml_key(key: str) -> str:
    """A bare key where TOML allows one, else quoted (a dotted name such as an env var)."""
    return key if key.replace("-", "").replace("_", "").isalnum() else json.dumps(key)


def to_toml(config: Mapping[str, Mapping[str, Any]]) -> str:
    """A two-level dict ({section: {key: value}}) as TOML text; a list of tables
    ({"smoke": [{...}, {...}]}) is written as an array of tables."""
    out = []
    for section, table in config.items():
        if isinstance(table, (list, tuple)):  # an array of tables: [[smoke]], [[adapters]]
            for item in table:
                out.append(f"[[{section}]]")
                out += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in item.items()]
                out.append("")
            continue
        out.append(f"[{section}]")
        out += [f"{_toml_key(key)} = {_toml_value(value)}" for key, value in table.items()]
        out.append("")
    return "\n".join(out)


def merge(base: Mapping[str, Mapping[str, Any]], *overrides: Mapping[str, Mapping[str, Any]]
          ) -> dict[str, dict[str, Any]]:
    """Section-wise merge of config dicts (later keys win; an array of tables, such as
    [[smoke]], is replaced whole)."""
    out: dict[str, Any] = {k: list(v) if isinstance(v, (list, tuple)) else dict(v)
                           for k, v in base.items()}
    for extra in overrides:
        for section, table in extra.items():
            if isinstance(table, (list, tuple)):
                out[section] = list(table)
            else:
                out.setdefault(section, {}).update(table)
    return out


def write_toml(path: Path, config: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write config to path as TOML; return the path."""
    path.write_text(to_toml(config))
    return path
