"""`vllm serve --config x.yaml` (vLLM's own YAML config): its keys folded into the line as the
flags they stand for, the line's own flags after them (they win, as in vLLM). Read bounded:
a regular file of at most 1 MiB, within 5 s; anything else is refused with what to do."""

from __future__ import annotations

import json
import os

from vllmwatch.config import safefile
from vllmwatch.config.flags import flag_name
from vllmwatch.config.serveline import LineError

MAX_YAML = 1 << 20  # a vLLM config is a few hundred bytes; more is not one
READ_TIMEOUT = 5.0
_WHAT_TO_DO = "write its keys on the line as flags (`--key value`) and run init again"


def fold(rest: list[str], cwd: str | None) -> tuple[list[str], str | None]:
    """(the words after the program with --config replaced by its keys, the YAML's path or
    None when the line has no --config). Raises LineError naming the file and what to do."""
    for i, word in enumerate(rest):
        name, eq, inline = word.partition("=")
        if name != "--config":
            continue
        path = inline if eq else (rest[i + 1] if i + 1 < len(rest) else "")
        if not path or path.startswith("-"):
            raise LineError("--config has no file after it: give vLLM's YAML config's path")
        path = os.path.join(cwd or os.getcwd(), path)
        after = rest[i + 1:] if eq else rest[i + 2:]
        return [*rest[:i], *words(_load(path)), *after], path
    return rest, None


def _load(path: str) -> dict[str, object]:
    try:
        import yaml  # type: ignore[import-untyped,unused-ignore]  # stubs not installed
    except ImportError:
        raise LineError(f"--config {path}: reading vLLM's YAML needs PyYAML, not installed "
                        f"for vllmwatch here; {_WHAT_TO_DO}") from None
    try:
        text = safefile.read_within(path, MAX_YAML, READ_TIMEOUT).decode("utf-8")
        data = yaml.safe_load(text)
    except safefile.FileProblem as exc:
        raise LineError(f"--config: {exc}; {_WHAT_TO_DO}") from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LineError(f"--config {path}: not YAML vLLM would read ({first}); "
                        f"{_WHAT_TO_DO}") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise LineError(f"--config {path}: expected a mapping of flag names to values, as "
                        f"vLLM reads it; {_WHAT_TO_DO}")
    return data


def words(data: dict[str, object]) -> list[str]:
    """The flags a YAML mapping stands for, as vLLM reads it: true -> --key, false ->
    --key False (init writes key = false), lists -> several values, tables -> JSON."""
    out: list[str] = []
    for key, value in data.items():
        flag = "--" + flag_name(key)
        if value is True:
            out.append(flag)
        elif value is False:
            out += [flag, "False"]
        elif isinstance(value, list):
            out += [flag, *(json.dumps(v) if isinstance(v, (dict, list)) else str(v)
                            for v in value)]
        elif isinstance(value, dict):
            out += [flag, json.dumps(value)]
        elif value is not None:
            out += [flag, str(value)]
    return out
