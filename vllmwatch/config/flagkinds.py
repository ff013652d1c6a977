"""Pure: what vLLM's best-known flags are in every vLLM we know (0.6 to 0.32), for when the
installed vLLM's own flag list cannot be learnt (config/vllmflags.py judges exactly where it
can, by each version's own readers, which refuse all this refuses).

Without that list a value was judged by its looks only, and one that no vLLM's parser takes
passed the load and `print-command`, and vLLM stopped at every start: a word for a switch
(`enforce-eager = "yes"`, `--enforce-eager=foo`), a table, a list, a fraction or no number at
all for a whole number (`max-model-len = {a=1}`, `tensor-parallel-size = 2.0`, `--max-model-len
""`), and a word that follows no flag (`-`, or one after a flag's value), which vLLM takes for
a second model. Each refusal here is one every version makes; a flag not listed is not judged.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence

from vllmwatch.config.errors import Problem
from vllmwatch.config.flagnames import ONE_WORD, flag_name

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
    if suffixed is not None:  # (int("1.5") in vLLM: no decimal before K, M, G, T)
        return not (whole and suffixed.group(2).isupper() and "." in suffixed.group(1))
    try:
        return math.isfinite(int(text) if whole else float(text))
    except ValueError:
        return False


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
