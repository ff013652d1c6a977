"""Parse and format the durations, sizes, rates and quiet-hours windows that the config
accepts (a window is a local-time span in which slow-leak restarts are allowed, spread per
host), and read a vLLM flag's number as vLLM's own readers do (vllm_read)."""

from __future__ import annotations

import hashlib
import json
import math
import re

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)", re.ASCII)

# Binary units are the norm for memory; decimal ones are accepted because people write them.
_SIZE_UNITS_MIB = {
    "b": 1 / 2**20,
    "kib": 1 / 1024,
    "k": 1 / 1024,
    "kb": 1000 / 2**20,
    "mib": 1.0,
    "m": 1.0,
    "mb": 1000**2 / 2**20,
    "gib": 1024.0,
    "g": 1024.0,
    "gb": 1000**3 / 2**20,
    "tib": 1024.0**2,
    "t": 1024.0**2,
    "tb": 1000**4 / 2**20,
    "pib": 1024.0**3,  # the sizes' ceiling (config/bounds.py) is written so
    "p": 1024.0**3,
    "pb": 1000**5 / 2**20,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$", re.ASCII)
_PER_HOUR = re.compile(r"\s*/\s*(h|hr|hour)\s*$", re.IGNORECASE)

DURATION_HELP = ('seconds as a number, or a string such as "500ms", "30s", "15m", "2h", "1h30m" '
                 '(each unit once, the largest first)')
SIZE_HELP = 'MiB as a number, or a string such as "512MiB", "75000MiB", "70GiB"'
RATE_HELP = 'MiB per hour as a number, or a string such as "200MiB/h", "1GiB/h"'


def parse_duration(value: object) -> float:
    """Return seconds for a number or a string like "1h30m"; raise ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a duration")
    if isinstance(value, (int, float)):
        return _finite(float(value))
    if not isinstance(value, str):
        raise ValueError("not a duration")
    text = value.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", text, re.ASCII):
        return float(text)
    pos, total, last = 0, 0.0, math.inf
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos and text[pos : match.start()].strip():
            raise ValueError("not a duration")
        unit = _DURATION_UNITS[match.group(2)]
        if unit >= last:  # "1h1h" (2 h?) or "30m1h": a typo, not a duration to guess at
            raise ValueError(f"{match.group(2)!r} after a unit as small or smaller; write "
                             "each unit once, the largest first (1h30m)")
        total, pos, last = total + float(match.group(1)) * unit, match.end(), unit
    if pos == 0 or text[pos:].strip():
        raise ValueError("not a duration")
    return _finite(total)


def parse_size_mib(value: object) -> float:
    """Return MiB for a number (MiB) or a string like "70GiB"; raise ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a size")
    if isinstance(value, (int, float)):
        return _finite(float(value))
    if not isinstance(value, str):
        raise ValueError("not a size")
    match = _SIZE.match(value)
    if not match:
        raise ValueError("not a size")
    unit = match.group(2).lower() or "mib"
    if unit not in _SIZE_UNITS_MIB:
        raise ValueError(f"unknown unit {match.group(2)!r}")
    return _finite(float(match.group(1)) * _SIZE_UNITS_MIB[unit])


def _finite(value: float) -> float:
    """nan and inf switch rules off or overflow timers: never a valid duration or size."""
    if not math.isfinite(value):
        raise ValueError("must be a finite number, not nan or inf")
    if value < 0:
        raise ValueError("must not be negative")
    return value


def parse_rate_mib_per_h(value: object) -> float:
    """Return MiB per hour for a number or a string like "200MiB/h"."""
    if isinstance(value, str):
        value = _PER_HOUR.sub("", value)
    return parse_size_mib(value)


def format_duration(seconds: float) -> str:
    """Format seconds compactly for humans: 95 -> "1m35s"."""
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 and seconds != int(seconds) else f"{seconds:.0f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def format_mib(mib: float) -> str:
    """Format MiB for humans: 75000 -> "73.2GiB"."""
    if abs(mib) >= 1024:
        return f"{mib / 1024:.1f}GiB"
    return f"{mib:.0f}MiB"


_WINDOW = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$", re.ASCII)


def parse_window(text: str) -> tuple[int, int]:
    """Parse "HH:MM-HH:MM" into (start, end) minutes after midnight; may wrap midnight."""
    match = _WINDOW.match(text)
    if not match:
        raise ValueError("not a window")
    h1, m1, h2, m2 = (int(g) for g in match.groups())
    if h1 > 23 or h2 > 24 or m1 > 59 or m2 > 59 or (h2 == 24 and m2 != 0):
        raise ValueError("hours must be 00-23 and minutes 00-59")
    start, end = h1 * 60 + m1, h2 * 60 + m2
    if start == end:
        raise ValueError("start and end are the same")
    return start, end


def in_window(text: str, minute_of_day: int) -> bool:
    """True when the window is empty (no restriction) or contains the given local minute."""
    if not text:
        return True
    start, end = parse_window(text)
    if start < end:
        return start <= minute_of_day < end
    return minute_of_day >= start or minute_of_day < end


def _clock(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"


def host_offset(key: str, span: int) -> int:
    """A stable minute in [0, span) for this host key: the same key, the same minute."""
    if span <= 0:
        return 0
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % span


def spread(text: str, key: str, fraction: float) -> str:
    """The window with its start moved by a per-host offset into its first `fraction`.

    A fleet sharing one config then spreads its quiet-hours restarts over the window instead
    of all restarting the minute it opens. The result lies inside the window and keeps at
    least (1 - fraction) of it; "" and fraction 0 leave the window as it is.
    """
    if not text or fraction <= 0:
        return text
    start, end = parse_window(text)
    length = end - start if start < end else end + 1440 - start
    span = min(int(length * fraction), length - 1)
    if span < 1:
        return text
    new_start = (start + host_offset(key, span)) % 1440
    return f"{_clock(new_start)}-{_clock(end)}"


# --- vLLM's readers of a flag's word ------------------------------------------------------
#
# vLLM 0.32's argparse reads each flag with one reader (vllmflags' probe records which): int()
# (--max-num-seqs: no `1k`, no `auto`), float() (--gpu-memory-utilization: no `32k`), its
# human_readable_int (--max-num-batched-tokens: `32k`, `25.6k`, `2K`, no `auto`), its
# human_readable_int_or_auto (--max-model-len only: also `auto`, `-1`), str, or a reader that
# lowers the word and turns - into _ (--moe-backend CUTLASS); "?" marks one wrapped in its
# optional_type, where "" and "None" (that case only) mean no value.

VLLM_READS = {"int": "a whole number read by int() (8192, -1; no suffix such as 32k, no auto)",
              "float": "a number read by float() (0.9, 1e-3; no suffix such as 32k, no auto)",
              "hr_int": "a whole number, or one with a suffix (8192, 32k = 32000, 32K = 32768, "
                        "25.6k; no auto, no decimal before K, M, G, T)",
              "hr_int_auto": "a whole number, or one with a suffix (8192, 32k = 32000, 32K = "
                             "32768, 25.6k; no decimal before K, M, G, T), or auto or -1",
              # an older vllmwatch's cache names no reader: what one of vLLM's takes
              "number": "a number (8192, 0.9, 32k)", "whole": "a whole number (8192, 32k)",
              # JSON readers: json.loads, a config class (parse_dataclass: an object whose
              # bare numbers may carry a suffix), a dict or a word (union_dict_and_str)
              "json": "JSON (a table in [vllm.args]; in a line '{\"field\": 1}', [1, 2], 5)",
              "object": "a JSON object (a table in [vllm.args]; in a line '{\"field\": 1}'; "
                        "bare numbers may carry a suffix: 80m, 4G)",
              "dict_or_str": "a word, or a JSON object ('{\"field\": 1}')",
              "jsonobj": "a JSON object (a table in [vllm.args]; in a line '{\"field\": 1}')",
              "lora": "NAME=PATH (no comma), or a JSON object with name and path "
                      "('{\"name\": \"sql\", \"path\": \"/srv/lora/sql\"}')"}
# vLLM's pattern has no re.ASCII, and int() and float() take any digit too
_VLLM_SUFFIXED = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
# What vLLM's parse_dataclass expands before its JSON is read: a bare suffixed number outside
# the quoted strings (engine/arg_utils.py _expand_json_human_readable_numbers)
_JSON_STRING = re.compile(r'("(?:[^"\\]|\\.)*")')
_JSON_SUFFIXED = re.compile(r"\b\d+(?:\.\d+)?[kKmMgGtT]\b")


JSON_READERS = ("json", "jsonobj", "object", "dict_or_str", "lora")


class NotFinite(ValueError):
    """A float vLLM's float() reads (nan, inf) that no setting of vLLM's is."""


def vllm_read(spec: str, word: str) -> object:
    """The value vLLM's reader `spec` (vllmflags' probe: int, float, hr_int, hr_int_auto, str,
    fold; "?" for optional_type) makes of one word; ValueError where vLLM stops. A float
    that is nan or inf is refused too: no setting of vLLM's is that."""
    base = spec.removesuffix("?")
    if spec.endswith("?") and word in ("", "None"):
        return None
    if base == "int":
        return int(word)
    if base == "float":
        number = float(word)
        if not math.isfinite(number):
            raise NotFinite(word)
        return number
    if base in JSON_READERS:
        return _json_read(base, word)
    text = word.strip()
    if base in ("number", "whole"):
        return _loose(text, base == "whole")
    if base == "hr_int_auto" and (text == "-1" or text.lower() == "auto"):
        return -1
    if base in ("hr_int", "hr_int_auto"):
        suffixed = _VLLM_SUFFIXED.fullmatch(text)
        if suffixed is None:
            return int(text)
        digits, suffix = suffixed.groups()
        if suffix.islower():  # a decimal multiplier takes a decimal (25.6k)
            number = float(digits) * 1000 ** " kmgt".index(suffix)
            if not math.isfinite(number):  # int() of it: vLLM's OverflowError, no value
                raise ValueError(f"{word!r} is past a float's range")
            return int(number)
        return int(digits) * 1024 ** " KMGT".index(suffix)  # int("1.5"): vLLM refuses 1.5K
    return word.lower().replace("-", "_") if base == "fold" else word


def expand_suffixes(text: str) -> str:
    """JSON text with each bare suffixed number outside its strings made whole, as vLLM's
    parse_dataclass does (80m -> 80000000); ValueError for one vLLM cannot expand (1.5K)."""
    return "".join(part if i % 2 else _JSON_SUFFIXED.sub(
        lambda m: str(vllm_read("hr_int", m.group())), part)
        for i, part in enumerate(_JSON_STRING.split(text)))


def _json_read(base: str, word: str) -> object:
    """What vLLM's JSON readers make of one word (vllm_read); ValueError where vLLM stops."""
    if base == "dict_or_str" and not re.match(r"(?s)^\s*{.*}\s*$", word):
        return word  # a word that is not an object stays a word
    if base == "lora" and "=" in word and "," not in word:
        return word  # the old form NAME=PATH (LoRAParserAction)
    if base == "object":
        word = expand_suffixes(word)
    value = json.loads(word)
    if base in ("object", "lora", "jsonobj") and not isinstance(value, dict) and not (
            base == "jsonobj" and value is None):  # (null: no setting, as vLLM's None)
        raise ValueError(word)
    if base == "lora" and not {"name", "path"} <= set(value):
        raise ValueError(word)  # LoRAModulePath(**value) needs both
    return value


def _loose(text: str, whole: bool) -> object:
    """What one of vLLM's number readers takes (int, float unless whole, human_readable_int,
    its _or_auto, optional_type's "no value"): for a flag whose reader is not known."""
    if text.lower() in ("", "auto", "none"):
        return None
    suffixed = _VLLM_SUFFIXED.fullmatch(text)
    if suffixed is None or (whole and suffixed.group(2).isupper() and "." in suffixed.group(1)):
        return int(text) if whole else vllm_read("float", text)  # int("1.5K") refuses
    return vllm_read("hr_int", text) if suffixed.group(2).islower() else text  # (1e400k)


def is_number_word(word: str) -> bool:
    """A word that one of vLLM's number readers takes (`-1` is a value, not a flag)."""
    try:
        vllm_read("number", word)
    except ValueError:
        return False
    return True


# --- a long text cut to a width, its start and its end kept -----------------------------------

CUT = " ... "  # where brief() took the middle of a detail out
WORD = 16  # characters brief() gives up to cut at a space rather than within a word


def brief(text: str, limit: int) -> str:
    """A record's detail in at most `limit` characters, redacted: its start and its end.
    A detail says what happened first and why last (a crash loop's numbers, then its last
    failure; a memory rule's figures, then the rule's name): a cut of the end alone dropped
    the cause ("...; the last: crash: during st")."""
    from vllmwatch.config.redact import EXCERPT_MARGIN, REDACT  # (units itself stays light)

    if len(text) <= limit + EXCERPT_MARGIN and len(whole := REDACT.text(text)) <= limit:
        return whole
    room = limit - len(CUT)
    tail = room * 3 // 5  # the end the more: the cause is said last
    # At a word's edge ("tart.max_restarts 5)" read as a typo): the end from the start of
    # the word it cuts, taken from the head's share, or after that word where it is long.
    end = REDACT.tail(text, tail + WORD)
    edge = end[:WORD + 1]
    end = end[edge.rindex(" ") + 1:] if " " in edge else end[WORD:]
    end = end[end.index(" ") + 1:] if " " not in edge and " " in end[:WORD] else end
    head = REDACT.head(text, room - len(end))
    head = head[:head.rindex(" ")] if " " in head[-WORD:] else head
    return head.rstrip() + CUT + end.lstrip()
