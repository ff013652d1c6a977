"""Converters from TOML values to typed config values, with what each accepts."""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Callable

from vllmwatch.config import units
from vllmwatch.config.hosts import host_ok
from vllmwatch.config.redact import REDACT
from vllmwatch.config.units import parse_window

Converter = Callable[[object], object]


SHOW_CHARS = 120  # of a value in a message: a 100 kB string is named, not echoed whole


def show(value: object) -> str:
    """A TOML value as a person wrote it, for error messages (a long one cut, its length
    said)."""
    if isinstance(value, str):
        if len(value) > SHOW_CHARS:
            return f"{REDACT.head(value, SHOW_CHARS)!r}... ({len(value)} characters)"
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, (datetime.date, datetime.time)):  # `timeout = 00:30:00`, unquoted:
        kind = "date-time" if isinstance(value, datetime.datetime) else type(value).__name__
        return f"{value.isoformat()} (a TOML {kind})"  # as written, not datetime.time(0, 30)
    text = repr(value)  # a number: a 4000-digit int is no more readable than a long string
    return text if len(text) <= SHOW_CHARS else \
        f"{REDACT.head(text, SHOW_CHARS)}... ({len(text)} digits)"


def choice(value: object, choices: tuple[str, ...]) -> str:
    """One of the choices, case-insensitive; ValueError otherwise."""
    if not isinstance(value, str) or value.lower() not in choices:
        raise ValueError("")
    return value.lower()


# 128 KiB (MAX_ARG_STRLEN) holds NAME=value and its NUL: a margin for the longest name
MAX_ONE_STRING = 128 * 1024 - 1024


def _no_nul(text: str, what: str = "") -> str:
    # A NUL byte cannot be in a command line, a path or an environment: the launch would
    # crash the daemon ("embedded null byte") instead of refusing the config.
    if "\0" in text:
        raise ValueError(f"{what}a NUL byte (\\u0000) cannot be passed to vLLM")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_ONE_STRING:  # the kernel's MAX_ARG_STRLEN: exec fails with E2BIG
        raise ValueError(f"{what}{size} bytes; the kernel passes at most {MAX_ONE_STRING} "
                         "in one argument or environment variable, so vLLM could not be "
                         "started (put a long value in a file and pass its path)")
    return text


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError("")
    return _no_nul(value)


def _name(value: object) -> str:
    """A model, a served name or a host: one word as vLLM reads it, printable on a terminal
    (`check` prints it; an ESC in it was sent raw), no space at an end (an error that does
    not show it), not read by vLLM as a flag (`--enable-auto-tool-choice` as a name)."""
    text = _str(value)
    if _CONTROL.search(text) or "\n" in text or "\t" in text:
        raise ValueError("a control character, shown as \\xNN, in it")
    if text != text.strip():
        raise ValueError("a space at an end")
    if text.startswith("-"):
        raise ValueError("it starts with '-', which vLLM reads as a flag")
    return text


def _host(value: object) -> str:
    text = _name(value)
    if text and not host_ok(text):
        raise ValueError("not a host name or an IP address")
    return text


def _path(value: object) -> str:
    """A file the service reads, or "" for none: absolute, since the service's working
    directory is not the shell's (`check` passed in the folder and failed from /)."""
    text = _name(value)
    if text and not text.startswith("/"):
        raise ValueError("a relative path: write it from / (the service starts elsewhere)")
    return text


def _dir(value: object) -> str:
    text = _path(value)
    if not text:
        raise ValueError("empty: the caches would land in whatever folder the service starts")
    return text


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError("")
    return value


def _int_in(low: int, high: int) -> Converter:
    def conv(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError("")
        return value

    return conv


def _number(value: object) -> float:
    # Range checks are in bounds.py, per key; here only the type.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("")
    return float(value)


def _str_list(value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError("")
    return [_no_nul(v, f"item {i}: ") for i, v in enumerate(value)]


def _command(value: object) -> list[str]:
    """vLLM's command: words, none of them empty (an empty program cannot be run; an empty
    word after it is a positional MODEL to vLLM, and the configured one a second)."""
    words = _str_list(value)
    if not words:
        raise ValueError("an empty command")
    empty = [i for i, w in enumerate(words) if not w.strip()]
    if empty:
        raise ValueError(f"item {empty[0]} is empty or blank")
    _program(words[0])
    return words


def _program(word: str) -> None:
    """What vllmwatch can exec as the service: a name on PATH or a path from /. A relative
    path passed `check` in its folder and failed the service (spawn_failed, exit 78) from
    WorkingDirectory=; `~` and `$VAR` are a shell's, and exec expands neither."""
    if _CONTROL.search(word) or word != word.strip():
        what = "a space at an end" if word.isprintable() else "a control character"
        raise ValueError(f"item 0 {word!r}: {what}, which no program's name has")
    if word.startswith(("~", "$")):
        raise ValueError(f"item 0 {word!r}: a shell expands {word[0]}, and vllmwatch runs "
                         "the program itself, with no shell; write the path from /")
    if "/" in word and not word.startswith("/"):
        raise ValueError(f"item 0 {word!r}: a relative path; write it from / (the service "
                         "starts elsewhere), or give a name on PATH")
    if "/" not in word and " " in word:
        raise ValueError(f"item 0 {word!r}: a program and its words in one item; write "
                         'each word as an item, e.g. ["vllm", "serve"]')


def _str_table(value: object) -> dict[str, str]:
    """An environment table: NAME = "value" (a string or number)."""
    if not isinstance(value, dict):
        raise TypeError("")
    out, bad = {}, []  # every bad entry named at once: one edit fixes the table
    for k, v in value.items():
        name = _name_shown(str(k))
        try:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(k)):
                raise ValueError(f"{name!r}: an environment variable's name has only "
                                 "letters, digits and _, and does not start with a digit")
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise ValueError(f"{name} = {show(v)} must be a string or number")
            _no_nul(f"{k}={v}", f"{name}: ")  # (NAME=value is one string to the kernel)
            out[str(k)] = str(v)
        except ValueError as exc:
            bad.append(str(exc))
    if bad:
        raise ValueError(_joined(bad))
    return out


def _args_table(value: object) -> dict[str, object]:
    if not isinstance(value, dict):
        raise TypeError("")
    bad = []  # every bad entry named at once: one edit fixes the table
    for k, v in value.items():
        name = _name_shown(str(k))
        try:
            if str(k).startswith("-"):
                raise ValueError(f"write flag names without dashes: {name.lstrip('-')!r}")
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", str(k)):
                raise ValueError(f"{name!r}: a flag's name has only letters, digits, - "
                                 "and _")
            if len(str(k)) > MAX_NAME:
                raise ValueError(f"{name!r}: no vLLM flag's name is so long")
            _flag_value(v, str(k))
        except ValueError as exc:
            bad.append(str(exc))
    if bad:
        raise ValueError(_joined(bad))
    return dict(value)


MAX_NAME = 200  # characters of a flag's name (vLLM's longest is under 50)
MAX_BAD = 10  # bad entries of one table a message names; the count says how many more


def _name_shown(name: str) -> str:
    """A table's key as a message shows it: a long one cut, its length said (a 300 kB name
    was echoed whole, as a long value is not: show)."""
    return name if len(name) <= SHOW_CHARS else \
        f"{REDACT.head(name, SHOW_CHARS)}... ({len(name)} characters)"


def _joined(bad: list[str]) -> str:
    more = len(bad) - MAX_BAD
    return "; ".join(bad[:MAX_BAD]) + (f"; and {more} more" if more > 0 else "")


def valid_args(value: object) -> dict[str, object]:
    """The entries of a [vllm.args] table that pass on their own (the flag checks still judge
    them when another entry refused the table)."""
    out: dict[str, object] = {}
    for k, v in value.items() if isinstance(value, dict) else ():
        try:
            _args_table({k: v})
        except ValueError:
            continue
        out[str(k)] = v
    return out


def _flag_value(value: object, key: str) -> None:
    """What a flag's value may be: what vLLM's command line can carry (a TOML date or time
    is not, nor a number that is not finite, nor a NUL byte)."""
    if isinstance(value, str):
        _no_nul(value, f"{key}: ")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{key}: {value}: vLLM takes finite numbers only")
    elif isinstance(value, list):
        for item in value:
            _flag_value(item, key)
    elif isinstance(value, dict):
        for k, item in value.items():
            _flag_value(item, f"{key}.{k}")
    elif not isinstance(value, (bool, int, float)):
        raise ValueError(f"{key}: a TOML {type(value).__name__} ({value}) cannot be a vLLM "
                         "flag's value; quote it (\"...\") to pass the text")


MAX_GPU_INDEX = 255  # NVML and CUDA_VISIBLE_DEVICES take small indexes; a larger one is a
# typo, and NVML's C unsigned int overflowed on it (a traceback, not an error)


def _gpu_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and \
        0 <= value <= MAX_GPU_INDEX


def _gpus(value: object) -> list[int] | None:
    if isinstance(value, str) and value.lower() == "all":
        return None
    if isinstance(value, int) and _gpu_index(value):
        return [value]
    if isinstance(value, list) and all(_gpu_index(v) for v in value):
        if len(set(value)) != len(value):
            raise ValueError("a GPU is listed twice")
        return list(value)
    raise ValueError("")


def _quiet_hours(value: object) -> str:
    text = _str(value).strip()
    if text:
        parse_window(text)
    return text


def _auto_bool(value: object) -> str:
    """"auto", or a boolean (TOML true/false or the strings "true"/"false"), as a string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and value.lower() in ("auto", "true", "false"):
        return value.lower()
    raise ValueError("")


CONVERTERS: dict[str, tuple[Converter, str]] = {
    "str": (_str, "a string"),
    "name": (_name, "a string"),
    "host": (_host, 'a host name or IP address, e.g. "127.0.0.1", "0.0.0.0", "::1"'),
    "path": (_path, 'an absolute path, or "" for none'),
    "dir": (_dir, "an absolute path"),
    "bool": (_bool, "true or false"),
    "port": (_int_in(1, 65535), "a port number 1-65535"),
    "pos_int": (_int_in(1, 1_000_000), "a whole number >= 1"),
    "auto_int": (_int_in(0, 1_000_000), "a whole number >= 1, or 0 for auto"),
    "pos_float": (_number, "a number"),
    "fraction": (_number, "a number"),
    "duration": (units.parse_duration, units.DURATION_HELP),
    "size": (units.parse_size_mib, units.SIZE_HELP),
    "rate": (units.parse_rate_mib_per_h, units.RATE_HELP),
    "str_list": (_str_list, "an array of strings"),
    "str_table": (_str_table, "a table of names to strings"),
    "args_table": (_args_table, "a table of vLLM flag names (no dashes) to values"),
    "gpus": (_gpus, f'an array of GPU indexes (0-{MAX_GPU_INDEX}) such as [0, 1], [] for '
             'CPU only, or "all"'),
    "command": (_command, 'an array of words such as ["/opt/vllm/bin/vllm", "serve"]'),
    "quiet_hours": (_quiet_hours, 'a local time window "HH:MM-HH:MM" such as "02:00-05:00"'),
    "choice": (_str, ""),
    "auto_bool": (_auto_bool, '"auto", true or false'),
}


# --- text for a terminal (was config/text.py, then in config/redact.py) ---------------------
# Text from outside (a /status answer, vLLM's output, an incident record) made safe to print
# on a person's terminal: control characters are shown as escapes, never sent raw.

# C0 and C1 controls and DEL, except newline and tab: ESC alone can retitle a terminal, move
# the cursor over earlier lines or hide text (a foreign service on the status port, or a
# line vLLM's output carried into a record).
# And the line and paragraph separators (a line break to some viewers) and the bidi
# overrides and isolates, which show text in another order than its bytes (Trojan Source).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, keep_newlines: bool = True) -> str:
    """``text`` with every control character as a visible ``\\xNN`` (``\\uNNNN``) escape
    (newline and tab kept, or escaped too when ``keep_newlines`` is False: a one-line field)."""
    out = _CONTROL.sub(_escape, text)
    if not keep_newlines:
        out = out.replace("\n", "\\n").replace("\t", "\\t")
    return out
