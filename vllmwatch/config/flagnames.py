"""Pure: what every vLLM we know (0.6 to 0.32) takes for a flag, for when the installed
vLLM's own flag list cannot be learnt (config/vllmflags.py judges exactly where it can).

Two rules hold in every version, so they refuse a config before a launch vLLM would refuse:
a long flag is lowercase words joined by `-` (argparse matches names exactly: `--API-KEY` is
unknown to it), and a flag that takes a value has no `--no-` form (only switches do), nor
can it be given bare (`max-model-len = true`)."""

from __future__ import annotations

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
