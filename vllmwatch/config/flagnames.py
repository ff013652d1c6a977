"""Pure: what every vLLM we know (0.6 to 0.32) takes for a flag, for when the installed
vLLM's own flag list cannot be learnt (config/vllmflags.py judges exactly where it can).

Two rules hold in every version, so they refuse a config before a launch vLLM would refuse:
a long flag is lowercase words joined by `-` (argparse matches names exactly: `--API-KEY` is
unknown to it), and a flag that takes a value has no `--no-` form (only switches do), nor
can it be given bare (`max-model-len = true`).

The value rules below (SWITCHES, NUMBERS, CHOICES, stray words) are the same kind of knowledge.
Without that list a value was judged by its looks only, and one that no vLLM's parser takes
passed the load and `print-command`, and vLLM stopped at every start: a word for a switch
(`enforce-eager = "yes"`, `--enforce-eager=foo`), a table, a list, a fraction or no number at
all for a whole number (`max-model-len = {a=1}`, `tensor-parallel-size = 2.0`, `--max-model-len
""`), and a word that follows no flag (`-`, or one after a flag's value), which vLLM takes for a
second model. Each refusal here is one every version makes; a flag not listed is not judged.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence

from vllmwatch.config.errors import Problem

# Text flags of vLLM that take one word (argparse's nargs=None; the flag list does not say
# nargs): a word after their value is the positional MODEL, as argparse reads it.
ONE_WORD = frozenset({"model", "host", "tokenizer", "revision", "dtype", "device"})
# vLLM's flags that take several numbers (nargs="+"): without a flag list, every other flag
# whose first word is a number takes that word alone (`--max-model-len 4096 /m` serves /m)
NUMBER_LISTS = frozenset({"cudagraph-capture-sizes", "numa-bind-nodes", "numa-bind-cpus"})
# Flags that take a value in every vLLM we know (0.6 to 0.32): without a flag list, one bare
# on the line (`--max-model-len` last, or before `4096>>x.log`, where sh takes 4096 for a
# descriptor) is the line's mistake, never a switch (`max-model-len = true`: vLLM refuses it)
VALUE_FLAGS = frozenset({
    "max-model-len", "tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size",
    "gpu-memory-utilization", "max-num-seqs", "max-num-batched-tokens", "quantization",
    "kv-cache-dtype", "tokenizer-revision", "download-dir", "load-format", "chat-template",
    "seed", "block-size", "max-lora-rank", "max-loras", "max-cpu-loras", "lora-modules",
    "tool-call-parser", "reasoning-parser", "cpu-offload-gb", "uvicorn-log-level",
    "distributed-executor-backend", "root-path", "response-role", *ONE_WORD, *NUMBER_LISTS})
# Value flags that may also stand bare (argparse nargs="?"): `--hf-token` alone reads the
# token huggingface_hub stored; they still have no `--no-` form.
BARE_OK = frozenset({"hf-token"})
TAKES_VALUE = VALUE_FLAGS | BARE_OK | {"api-key"}
_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


def flag_name(key: str) -> str:
    """Normalise a flag name as vLLM's parser does: no dashes in front, dashes instead of
    underscores before the first dot only (`hf_overrides.rope_scaling` is the flag
    `hf-overrides` and the key `rope_scaling` of its JSON, which keeps its underscore)."""
    head, dot, tail = key.lstrip("-").partition(".")
    return head.replace("_", "-") + dot + tail


def after_secret(words: Sequence[str], i: int, secret_flags: Iterable[str]) -> bool:
    """Whether words[i] follows a secret flag given bare (`--api-key --Zq7...`, or an
    abbreviation of one): argparse reads it as a flag, but it is the key the person meant,
    so no check may name it in a message (the flag's own problem says what is wrong)."""
    prev = words[i - 1] if i > 0 else ""
    name = flag_name(prev[2:])
    return prev.startswith("--") and "=" not in prev and bool(name) and any(
        f.startswith(name) for f in secret_flags)


def is_lowercase(name: str) -> bool:
    """Whether vLLM's parser could know this long flag: lowercase words joined by `-`."""
    return _NAME.fullmatch(name) is not None


def spelled(name: str) -> str:
    """The flag a misspelt name most likely meant: lowercase, runs of anything else one `-`."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def shape_problem(name: str, value: object, key: str, json_flags: frozenset[str] = frozenset(),
                  short: Mapping[str, str] | None = None) -> Problem | None:
    """Why every vLLM refuses this flag (normalised by flags.flag_name) and value, by the two
    rules above; None when they allow it. json_flags: the flags known to take JSON; short:
    vLLM's short flags and their long names (`O = 3` meant -O, --optimization-level)."""
    head = name.partition(".")[0]  # (after a dot: a key of the flag's JSON, any spelling)
    if not is_lowercase(head):
        mean = (short or {}).get(f"-{head}") or spelled(head)
        return Problem(key, f"--{head} is not a vLLM flag: vLLM's flags are lowercase words "
                       "joined by - and its parser matches them exactly"
                       + (f"; write {mean}" if mean else "; remove it"))
    if head != name:
        return None
    value_flags = TAKES_VALUE | json_flags
    if name.startswith("no-") and name[3:] in value_flags and value is not False:
        return Problem(key, f"--{name} is not a vLLM flag: --{name[3:]} takes a value and only "
                       f"switches have a --no- form; delete it to leave --{name[3:]} at "
                       "vLLM's default")
    if value is False and name in value_flags:
        return Problem(key, f"{name} = false would pass --no-{name}, which vLLM refuses: "
                       f"--{name} takes a value and only switches have a --no- form; delete "
                       "the key to leave it at vLLM's default")
    if value is True and name in value_flags - BARE_OK:
        return Problem(key, f"{name} = true passes --{name} with no value, which vLLM "
                       f"refuses: --{name} takes one; write {name} = VALUE")
    return None


# Switches (store_true, BooleanOptionalAction; --enable-chunked-prefill's older StoreBoolean
# takes only a true or false, which the load refuses for every flag) in every vLLM that has them
SWITCHES = frozenset({
    "enforce-eager", "trust-remote-code", "enable-prefix-caching", "enable-chunked-prefill",
    "enable-auto-tool-choice", "disable-log-stats", "enable-lora", "disable-custom-all-reduce",
    "enable-expert-parallel", "disable-sliding-window", "skip-tokenizer-init",
    "enable-sleep-mode", "enable-prompt-tokens-details", "disable-fastapi-docs",
    "enable-request-id-headers", "disable-uvicorn-access-log", "enable-server-load-tracking",
    "enable-force-include-usage", "fully-sharded-loras", "async-scheduling",
    "enable-prompt-embeds", "enable-eplb", "enable-log-requests"})
# Number flags and the loosest reader any vLLM had for them (units.vllm_read's "whole": int,
# human_readable_int, its _or_auto, optional_type's "" and None; "number": float too)
NUMBERS = {**dict.fromkeys((
    "max-model-len", "tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size",
    "max-num-seqs", "max-num-batched-tokens", "seed", "block-size", "max-loras",
    "max-lora-rank", "max-cpu-loras", "max-logprobs", "cudagraph-capture-sizes"), "whole"),
    **dict.fromkeys(("gpu-memory-utilization", "cpu-offload-gb", "swap-space"), "number")}
# Of those, the ones no vLLM reads with optional_type (its field was never Optional): an
# empty word is no number to any of them (`--max-model-len ""`, `$LEN` unset)
NEVER_EMPTY = frozenset({"max-model-len", "tensor-parallel-size", "pipeline-parallel-size",
                         "data-parallel-size", "gpu-memory-utilization"})
LISTS = frozenset({"cudagraph-capture-sizes"})  # nargs="+": one number a word
# Choices that every vLLM gave (vLLM 0.6's argparse choices and 0.32's ModelDType alike)
CHOICES = {"dtype": ("auto", "half", "float16", "bfloat16", "float", "float32"),
           "uvicorn-log-level": ("critical", "debug", "error", "info", "trace", "warning")}
# Flags that take exactly one word in every vLLM: a word after it and its value is the model
ONE_VALUE = frozenset({*NUMBERS, *CHOICES, *ONE_WORD} - LISTS)
_NEGATIVE = re.compile(r"-\d+|-\d*\.\d+")  # argparse reads these as values, not as flags


def show(value: object) -> str:
    """A value as written, never cut (config/convert.show cuts through the redactor, which
    imports config/flags: a circle); a long word is named by its length."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return "a table" if isinstance(value, dict) else "an array"
    return repr(value) if len(repr(value)) <= 60 else f"a word of {len(str(value))} characters"


def value_problem(name: str, value: object, key: str) -> Problem | None:
    """Why every vLLM refuses this value of one of the flags above (name normalised by
    flag_name, value as in [vllm.args] or the word of a command line), or None; a value
    None is one not seen (vllm.env_file's, never read into a message): not judged."""
    if value is None:
        return None
    if name in SWITCHES and not isinstance(value, bool):
        return Problem(key, f"--{name} is a switch in every vLLM and takes no value, and "
                       f"{show(value)} is one: vLLM stops at every start (a word of its "
                       "own after it is a second model to vLLM); write "
                       f"{name} = true, or leave it out")
    if isinstance(value, bool) or (name not in NUMBERS and name not in CHOICES):
        return None  # (true and false: config/flagnames' rules)
    word = json.dumps(value, separators=(",", ":")) if isinstance(value, (dict, list)) \
        else str(value)  # as config/command.py writes it on vLLM's command line
    if name in CHOICES:
        if word in CHOICES[name]:
            return None
        return Problem(key, f"--{name} {show(value)} is not accepted by any vLLM; choose one "
                       f"of {', '.join(CHOICES[name])}")
    if isinstance(value, list) and name in LISTS:
        words = ", ".join(json.dumps(str(v)) for v in value[:3]) + ", ..." * (len(value) > 3)
        return Problem(key, f"--{name} takes its numbers as words of their own, and a list "
                       f"here is one JSON word ({show(value)}), which vLLM cannot read; "
                       f'write them in vllm.extra_args: ["--{name}", {words}]')
    if _reads(word, whole=NUMBERS[name] == "whole", empty=name not in NEVER_EMPTY):
        return None
    what = "a whole number (8192, 32k)" if NUMBERS[name] == "whole" else "a number (0.9)"
    return Problem(key, f"--{name} {show(value)} is not {what}, which every vLLM reads there: "
                   "it would stop at every start")


# A number with a suffix, as vLLM's human_readable_int reads it (units._VLLM_SUFFIXED: units
# imports the redactor, which imports config/flags: a circle)
_SUFFIXED = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


def _reads(word: str, whole: bool, empty: bool) -> bool:
    """Whether one of vLLM's number readers takes the word (units' loose "whole" and
    "number": int, float unless whole, human_readable_int, its _or_auto, optional_type's
    "" and None where `empty`)."""
    text = word.strip()
    if text.lower() in ("auto", "none") or (empty and not text):
        return True
    suffixed = _SUFFIXED.fullmatch(text)
    if suffixed is not None:  # (int("1.5") in vLLM: no decimal before K, M, G, T; and
        # int(float(digits) * 1000) past a float's range is vLLM's OverflowError)
        digits, suffix = suffixed.groups()
        return not (whole and suffix.isupper() and "." in digits) and (suffix.isupper() or (
            math.isfinite(float(digits) * 1000 ** " kmgt".index(suffix))))
    try:
        number = int(text) if whole else float(text)
    except ValueError:
        return False
    return whole or math.isfinite(number)  # (isfinite of a 400-digit int: OverflowError)


def positional(words: Sequence[str], i: int, switch: bool = False) -> bool:
    """Whether vLLM's parser reads words[i] as a positional (a model), not a flag's value:
    no long flag without `=` before it, or one of SWITCHES, which take no word in any vLLM
    (`vllm serve --enforce-eager /m` serves /m). `switch`: only the second case."""
    before = words[i - 1] if i > 0 else ""
    bare = before.startswith("--") and "=" not in before
    after_switch = bare and flag_name(before).partition(".")[0] in SWITCHES
    return after_switch if switch else (not bare or after_switch)


def stray_problems(words: Sequence[str], where: str, offset: int = 0) -> list[Problem]:
    """The words of an argv list (vllm.extra_args, in long form) that follow no flag, as
    vLLM's parser reads them: a lone `-` (argparse's word for stdin, never a flag) or a word
    after a flag joined to its value (`--max-model-len=4096 x`), after a switch's place, or
    after the value of a flag of one word (`--max-model-len 4096 x`). vLLM takes it for a
    second model and stops. Where a flag is not known, its words are not judged."""
    out = []
    room: int | None = 0  # words the last flag may still take; None: not known
    for i, word in enumerate(words):
        if word.startswith("-") and word != "-" and not _NEGATIVE.fullmatch(word):
            name, eq, _ = word.lstrip("-").partition("=")
            base = flag_name(name).partition(".")[0]
            room = None if not word.startswith("--") else 0 if eq or base in SWITCHES else \
                1 if base in ONE_VALUE and "." not in name else None  # (-x: not known)
        elif room:
            room -= 1
        elif room == 0 and word.strip() and (word == "-" or not word.startswith("-")) and not (
                # (an empty word has its own rule, and is vllm.command's model blanked)
                i and words[i - 1].startswith("--") and flag_name(words[i - 1]) in SWITCHES):
            # (a word right after a switch: the switch's own problem names it)
            said = "a lone -" if word == "-" else "a word"  # (never shown: it may be a key)
            out.append(Problem(f"{where}[{i + offset}]", f"{said} follows no flag that takes "
                               "it (a flag joined to its value with =, a switch, or a flag of "
                               "one value given one): vLLM takes it for a second model and "
                               "stops at every start; remove it"))
    return out
