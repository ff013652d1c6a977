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
_WHAT_TO_DO = ("write its settings on the line as flags (`--max-model-len 8192`) and run init "
               "again")


def fold(rest: list[str], cwd: str | None) -> tuple[list[str], str | None]:
    """(the words after the program with --config replaced by its keys, the YAML's path or
    None when vLLM reads none). As vLLM's parser does (`_pull_args_from_config`): the keys go
    right after the model, before every flag of the line, so the line's flags win wherever
    --config stands; only the two words `--config FILE` are read (vLLM takes
    `--config=FILE` as a flag it then ignores: dropped here too, with nothing folded).
    Raises LineError naming the file and what to do."""
    for i, word in enumerate(rest):
        if word.startswith("--config="):
            return [*rest[:i], *rest[i + 1:]], None
        if word != "--config":
            continue
        path = rest[i + 1] if i + 1 < len(rest) else ""
        if not path or path.startswith("-"):
            raise LineError("--config has no file after it: give vLLM's YAML config's path")
        path = os.path.join(cwd or os.getcwd(), path)
        model = 1 if rest and not rest[0].startswith("-") else 0
        return [*rest[:model], *words(_load(path)), *rest[model:i], *rest[i + 2:]], path
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
    except (RecursionError, ValueError):  # PyYAML recurses per level of nesting
        raise LineError(f"--config {path}: nested too deep to read (no vLLM flag nests more "
                        f"than a few levels); {_WHAT_TO_DO}") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise LineError(f"--config {path}: expected a mapping of flag names to values, as "
                        f"vLLM reads it; {_WHAT_TO_DO}")
    if not _within(data, MAX_NODES, 0):
        raise LineError(f"--config {path}: its values expand to more than {MAX_NODES} items or "
                        f"{MAX_DEPTH} levels (YAML aliases of aliases, or an alias of "
                        f"itself), more than any vLLM flag takes; {_WHAT_TO_DO}")
    return data


# PyYAML builds an alias as a reference (the load is fast), but the flags' words write
# every reference out: nine levels of nine aliases are 387 million items, a hang or a
# MemoryError. What the words would hold is counted first, with a budget.
MAX_NODES = 100_000
MAX_DEPTH = 64


def _within(value: object, budget: int, depth: int) -> int:
    """The budget left after counting `value` as written out (0: over the budget or too
    deep; a value that refers to itself is too deep)."""
    budget -= 1
    if budget <= 0 or depth > MAX_DEPTH:
        return 0
    items = value.values() if isinstance(value, dict) else (
        value if isinstance(value, list) else ())
    for item in items:
        budget = _within(item, budget, depth + 1)
        if budget <= 0:
            return 0
    return budget


def words(data: dict[str, object]) -> list[str]:
    """The flags a YAML mapping stands for, as vLLM's `load_config_file` reads it: true ->
    --key, false -> --key False (init writes key = false), a list -> its items (none when
    empty), a table -> JSON, anything else (null included: `None`) -> its str()."""
    out: list[str] = []
    for key, value in data.items():
        flag = "--" + flag_name(key)
        if value is True:
            out.append(flag)
        elif value is False:
            out += [flag, "False"]
        elif isinstance(value, list):
            out += [flag, *map(str, value)] if value else []
        elif isinstance(value, dict):
            try:
                out += [flag, json.dumps(value)]
            except (ValueError, RecursionError):  # an alias of itself: no JSON, no vLLM
                raise LineError(f"--config: the value of {key!r} refers to itself (a YAML "
                                f"alias); {_WHAT_TO_DO}") from None
            except TypeError as exc:  # a YAML date or !!binary: JSON has no such value
                raise LineError(f"--config: the value of {key!r} holds what JSON cannot say "
                                f"({exc}); write it as a string; {_WHAT_TO_DO}") from None
        elif value is None or isinstance(value, (str, int, float)):  # null: `None`, as
            out += [flag, str(value)]  # vLLM's load_config_file passes it
        else:  # a YAML date, time or !!binary: vLLM's own reading of it is no flag value
            raise LineError(f"--config: the value of {key!r} is a YAML "
                            f"{type(value).__name__}, not a string or number; write it as a "
                            f"string; {_WHAT_TO_DO}")
    return out
