"""Pure: the vLLM flags we refuse before launch, and the secret ones we move to the environment.

Every function here returns Problems instead of raising, so that a config carrying a guide's
whole set of bad flags is refused once, with all of them listed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from vllmwatch.config import flagnames
from vllmwatch.config.errors import Problem
from vllmwatch.config.flagnames import flag_name as flag_name

OWNED_FLAGS = {
    "model": "vllm.model", "port": "vllm.port", "host": "vllm.host",
    "served-model-name": "vllm.served_model_name",
}
# Flags that take vLLM's API off the plain HTTP on vllm.host:vllm.port that every probe (and
# the gate) speaks: the start would never be READY, a crash loop at each launch.
OFF_THE_PROBES = {
    "uds": "makes vLLM listen on a Unix socket only, never on vllm.host:vllm.port",
    "ssl-keyfile": "makes vLLM speak only TLS on vllm.port, where vllmwatch's probes (and "
                   "the gate) speak plain HTTP",
    "headless": "runs vLLM's engines without an API server",
}
OFF_THE_PROBES["ssl-certfile"] = OFF_THE_PROBES["ssl-keyfile"]
# Secret flags and the variable vLLM (or huggingface_hub) reads instead: argv is public (ps,
# /proc/PID/cmdline), the environment is readable only by the process owner and root.
SECRET_FLAGS = {"hf-token": "HF_TOKEN", "api-key": "VLLM_API_KEY"}
ARG_PREFIX = "VLLMWATCH_ARG_"  # in vllm.env_file: a flag's value, not a variable
# A dash a web page typeset (an em or en dash before api-key): vLLM takes the word for a
# positional and refuses the line (init reads it as the -- that was meant, saying so).
DASHES = ("\u2014", "\u2013", "\u2212", "\u2012", "\u2010", "\u2011", "\ufe63", "\uff0d")
# Every word some vLLM takes for --kv-cache-dtype (0.32 takes float16 too): this list judges only
# where vLLM's own flag list is not cached, which then judges its own choices exactly.
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc",
                   "fp8_ds_mla", "fp8_per_token_head", "int4_per_token_head",
                   "int8_per_token_head", "nvfp4", "nvfp4_4over6", "nvfp4_ds_mla",
                   "turboquant_3bit_nc", "turboquant_4bit_nc", "turboquant_k3v4_nc",
                   "turboquant_k8v4", "ultraquant_4bit")
# Flags removed from vLLM, with what to do instead.
REMOVED = {
    "rope-scaling": "use hf-overrides = { rope_parameters = { rope_type = \"yarn\", factor = "
                    "4.0, original_max_position_embeddings = 32768 } } in [vllm.args]",
    "disable-logprobs-during-spec-decoding": "delete it (nothing replaces it)",
    "device": "vLLM picks the platform itself; choose GPUs with vllm.gpus = [0, 1] instead",
    "disable-log-requests": "delete it: request logging is off by default; "
                            "enable-log-requests = true turns it on",
}
REMOVED["rope-theta"] = REMOVED["rope-scaling"]
# vLLM's flags that take JSON, for when its own flag list is not cached (vllmflags.FlagSet
# .kinds has the full answer). Only these are parsed as JSON: a text flag whose value starts
# with "{" (a single-line Jinja chat-template) stays text.
BUILTIN_JSON = frozenset({  # vLLM 0.32.0's JSON flags (its argparse types), common ones first
    "hf-overrides", "compilation-config", "speculative-config", "kv-transfer-config",
    "kv-events-config", "ec-transfer-config", "override-generation-config", "limit-mm-per-prompt",
    "mm-processor-kwargs", "media-io-kwargs", "model-loader-extra-config", "additional-config",
    "pooler-config", "structured-outputs-config", "attention-config", "default-mm-loras",
    "model-class-overrides", "eplb-config", "kernel-config", "quantization-config",
    "watermark-config", "custom-histogram-buckets", "default-chat-template-kwargs",
    "allowed-origins", "allowed-methods", "allowed-headers", "pt-load-map-location",
    "diffusion-config", "fault-tolerance-config", "logging-config", "ir-op-priority",
    "ec-manager-config", "engram-config", "reasoning-config", "aux-output-config",
    "profiler-config", "weight-transfer-config",
})


# Flags vLLM appends to when given again (action="append"; vllm/entrypoints/launchers/
# cli_args.py, 0.26-0.32): every other flag keeps its last value.
APPEND_FLAGS = frozenset({"middleware"})


def json_problem(text: str, key: str) -> Problem | None:
    """A Problem when text is not valid JSON."""
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return Problem(key, f"bad JSON {text!r}: {exc.msg} at column {exc.colno}; in "
                       "[vllm.args] write it as a TOML table instead, e.g. hf-overrides = "
                       "{ rope_parameters = { rope_type = \"yarn\" } }")
    return None


def flag_problem(name: str, value: object, key: str, version: str | None = None,
                 json_flags: frozenset[str] = BUILTIN_JSON) -> Problem | None:
    """The flags a widely copied guide gets wrong, each with its modern replacement."""
    # vLLM's parser takes a unique prefix for a flag (allow_abbrev), and `--NAME.k V` as --NAME
    # '{"k": V}': --por 9000 moves vLLM off the probed port, --api-k or --api-key.k puts the key
    # on argv in clear, --a.b stops vLLM (`ambiguous option`): judged by NAME alike
    base = name.partition(".")[0]
    whole = next((f for f in (*OWNED_FLAGS, *SECRET_FLAGS) if f.startswith(base)), None)
    if whole is not None and (name != whole or whole in OWNED_FLAGS):
        use = OWNED_FLAGS.get(whole) or f"{whole} written in full (vllmwatch moves it to vLLM's " \
            "environment, off its command line)"
        said = [f"--{name} is read by vLLM as --{base} set to a JSON object"] * (base != name) + \
            [f"--{base} is --{whole} abbreviated (vLLM's parser takes prefixes, or stops where "
             "two flags start so)"] * (base != whole) or [f"--{name} is set by vllmwatch"]
        return Problem(key, f"{', and '.join(said)}; use {use}")
    if name == "api-key" and value is True:  # vLLM's --api-key always takes a word
        return Problem(key, "--api-key has no value (the word after it starts with --, or "
                       "there is none): vLLM refuses the line, and a key that starts with "
                       "-- would stay on its command line in clear; put the key in "
                       "vllm.api_key_file (or join the flag and the key with = in one word)")
    if name in OFF_THE_PROBES and value is not False:
        return Problem(key, f"--{name} {OFF_THE_PROBES[name]}: no probe would reach it and "
                       "the start would never be READY; remove it (for TLS, put a TLS proxy "
                       "in front of vLLM or of [gate])")
    if name == "config" and value is not False:
        return Problem(key, "--config makes vLLM read flags from a YAML file that no check "
                       "of vllmwatch sees (a port, a socket or a model there would pass "
                       "unjudged); put its settings in [vllm.args]: `vllmwatch init -- vllm "
                       "serve --config FILE` converts the file")
    if name in ("help", "version") and value is not False:
        return Problem(key, f"--{name} makes vLLM print and exit 0 without serving, at every "
                       "launch; remove it (`vllm serve --help` shows the flags)")
    if name in REMOVED:
        where = f"vLLM {version}" if version else "vLLM"
        return Problem(key, f"--{name} was removed from {where}; {REMOVED[name]}")
    if name == "kv-cache-dtype" and isinstance(value, str) and value not in KV_CACHE_DTYPES:
        hint = " (fp16 is not a choice: \"auto\" keeps the model's dtype)" if value in (
            "fp16", "half") else ""
        return Problem(key, f"--kv-cache-dtype {value!r} is not accepted{hint}; "
                       f"choose one of {', '.join(KV_CACHE_DTYPES)}")
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return Problem(key, f"--{name} is a boolean flag and takes no value {value!r}; in "
                       f"[vllm.args] write {name} = true (--{name}) or {name} = false "
                       f"(--no-{name})")
    if isinstance(value, str) and value.lstrip().startswith(("{", "[")) and name in json_flags:
        return json_problem(value, key)
    return flagnames.shape_problem(name, value, key, json_flags, SHORT_FLAGS) or \
        flagnames.value_problem(name, value, key)  # (what no vLLM takes: its reader's words)


def args_problems(args: Mapping[str, object], extra: Sequence[str],
                  version: str | None = None, where: str = "vllm.extra_args", offset: int = 0
                  ) -> list[Problem]:
    """Every refused flag in [vllm.args] and vllm.extra_args (JSON judged by BUILTIN_JSON);
    `where` and `offset` name the words when they are vllm.command's (command_problems)."""
    out = [flag_problem(flag_name(k), v, f"vllm.args.{k}", version) for k, v in args.items()]
    extra = long_forms(extra)
    for i, token in enumerate(extra):
        key = f"{where}[{i + offset}]"
        if token == "--":  # argparse: the end of the flags; the words after it positionals
            out.append(Problem(key, "a bare -- ends vLLM's flags: what follows it is taken "
                               "for a second model and vLLM refuses to start; remove it"))
        elif not token.strip() and not is_value_of_flag(extra, i):  # vLLM reads it as a
            # positional and exits at once (a flag's empty value is the flag's business)
            out.append(Problem(key, "an empty word; remove it"))
        elif token[:1] in DASHES and token[1:2].isalpha():
            out.append(Problem(key, f"{token.split()[0]!r} starts with a typographic dash "
                               "(copied from a web page?), which vLLM takes for a second "
                               f"model: write --{token[1:].split()[0]}"))
        elif token == "-h" or token.startswith("-h="):  # vLLM's short --help
            out.append(Problem(key, "-h is --help: it makes vLLM print its help and exit 0 without "
                               "serving, at every launch; remove it"))
        elif token.startswith("--"):
            name, eq, inline = token[2:].partition("=")
            after = extra[i + (1 if eq else 2):][:1]  # the word after its value
            if flag_name(name) == "api-key" and after and not after[0].startswith("-"):
                # (`--api-key with`, `key: vllmwatch`: the redactor reads a value there)
                out.append(Problem(key, "`--api-key` has more than one key, and vllmwatch "
                                   "moves one off vLLM's command line, a second would stay "
                                   "there in clear; give one key (vllm.api_key_file)"))
            value: object
            if len(name.split()) > 1:  # "--max-model-len 8192" as one item: one word
                out.append(Problem(key, f"--{name.split()[0]} and its value are one word to "
                                   "vLLM (a flag named with a space, which it takes for a "
                                   "second model): write them as two items"))
                name, value = name.split()[0], " ".join(name.split()[1:])
            else:
                value = inline if eq else next_value(extra, i)
            if not flagnames.after_secret(extra, i, SECRET_FLAGS):  # (a key: never said)
                out.append(flag_problem(flag_name(name), value, key, version))
        elif loose_negative(token):
            flag = extra[i - 1] if is_value_of_flag(extra, i) else "--FLAG"
            out.append(Problem(key, f"{token!r} is not read as a value by vLLM, which takes a word "
                               "that starts with - for a flag (or, with a dot, a JSON key) and "
                               f"stops; join it to its flag with =: {flag}={token}"))
        elif i == 0 and not token.startswith("-") and where == "vllm.extra_args":
            out.append(Problem(key, f"{token!r} comes before any flag: vLLM takes it for a "
                               "second model and refuses to start (extra_args hold flags "
                               "and their values)"))
        elif token.lstrip().startswith(("{", "[")) and not is_value_of_flag(extra, i):
            out.append(json_problem(token, key))
    said = {p.key for p in out if p is not None}  # (a word one rule above named already)
    out += [p for p in flagnames.stray_problems(extra, where, offset) if p.key not in said]
    return [p for p in out if p is not None] + _twice(args, extra)


def _twice(args: Mapping[str, object], extra: Sequence[str]) -> list[Problem]:
    """A flag set twice where vLLM takes the last one silently: two spellings of one key in
    [vllm.args] (max_model_len and max-model-len), or a key of [vllm.args] again in
    extra_args, where vllmwatch (the spare's plan, check) reads the table's value and vLLM
    the other. Repeated tokens within extra_args are left alone (append flags)."""
    first: dict[str, str] = {}
    out = []
    for k in args:
        key = f"vllm.args.{k}"
        if flag_name(k) in first:
            # the key in backticks: the redactor read `vllm.args.api_key too` as a name, a value
            out.append(Problem(key, f"--{flag_name(k)} is set by `{first[flag_name(k)]}` "
                                    "too (vLLM would take the last one); keep one"))
        first.setdefault(flag_name(k), key)
    for i, token in enumerate(extra):
        name = flag_name(token.partition("=")[0]) if token.startswith("--") else ""
        if name in first:
            out.append(Problem(f"vllm.extra_args[{i}]", f"--{name} is set by `{first[name]}` "
                               "too (vLLM would take the last one); keep one"))
    return out


def loose_negative(word: str) -> bool:
    """A negative number vLLM 0.32 cannot take as a word of its own: argparse reads -1e3 as a
    flag ("expected one argument"), vLLM's parser -0.5 as a JSON key (it stops, or eats a word)."""
    if not word.startswith("-") or word.startswith("--") or re.fullmatch(r"-\d+", word):
        return False
    try:
        float(word)
    except ValueError:
        return False
    return True


def is_value_of_flag(extra: Sequence[str], i: int) -> bool:  # (judged with its flag)
    return i > 0 and extra[i - 1].startswith("--") and "=" not in extra[i - 1]


# vLLM's short flags (0.32's parser aliases; vllmflags' probe has each version's own), and
# -O: `-tp 2` in extra_args is --tensor-parallel-size to vLLM, so to every check and reader.
SHORT_FLAGS = {"-tp": "tensor-parallel-size", "-pp": "pipeline-parallel-size",
               "-dp": "data-parallel-size", "-q": "quantization", "-O": "optimization-level",
               "-sc": "speculative-config", "-cc": "compilation-config", "-ac": "attention-config",
               "-dc": "diffusion-config", "-n": "nnodes", "-r": "node-rank",
               "-ep": "enable-expert-parallel", "-asc": "api-server-count",
               "-dcp": "decode-context-parallel-size", "-pcp": "prefill-context-parallel-size",
               "-dpn": "data-parallel-rank", "-dpr": "data-parallel-start-rank",
               "-dpl": "data-parallel-size-local", "-dpa": "data-parallel-address",
               "-dpp": "data-parallel-rpc-port", "-dpb": "data-parallel-backend",
               "-dph": "data-parallel-hybrid-lb", "-dpe": "data-parallel-external-lb",
               "-dpm": "data-parallel-multi-port-external-lb"}


def long_form(token: str, aliases: Mapping[str, str] | None = None) -> str:
    """A short flag in its long form, one word for one, so that indexes stay (`-tp=2` ->
    `--tensor-parallel-size=2`, `-O3` -> `--optimization-level=3`); any other word as it
    is. For the checks and readers only: vLLM gets extra_args as written."""
    head, eq, inline = token.partition("=")
    known = {**SHORT_FLAGS, **(aliases or {})}
    if head in known and head != "-h":  # (-h is refused on its own: vLLM's --help)
        return f"--{known[head]}{eq}{inline}"
    if token.startswith("-O") and len(token) > 2:  # -O3, -O=3: vLLM's FlexibleArgumentParser
        return f"--{known['-O']}={token[2:].removeprefix('=')}"
    return token


def long_forms(extra: Sequence[str], aliases: Mapping[str, str] | None = None) -> list[str]:
    """Every word of extra_args in its long form (long_form)."""
    return [long_form(t, aliases) for t in extra]


def table(args: Mapping[str, object], extra: Sequence[str]) -> dict[str, object]:
    """[vllm.args] and extra_args as one {flag-name: value} table, as vLLM reads its argv:
    extra_args after the table (the last wins), a flag without a value True."""
    found = {flag_name(str(k)): v for k, v in args.items()}
    extra = long_forms(extra)
    for i, token in enumerate(extra):
        if token.startswith("--"):
            name, eq, inline = token[2:].partition("=")
            found[flag_name(name)] = inline if eq else next_value(extra, i)
    return found


def next_value(extra: Sequence[str], i: int) -> object:
    """The value that follows flag i in an argv list, or True for a bare flag."""
    if i + 1 < len(extra) and not extra[i + 1].startswith("--"):
        return extra[i + 1]
    return True


def pair_words(pairs: Sequence[str]) -> list[str]:
    """vllm.env_file's (flag, value) pairs as argv words. Its value is the rest of its line,
    whatever it starts with; a word of its own that starts with "--" (a key from
    secrets.token_urlsafe() may) was read as the next flag (next_value, vLLM's argparse): the
    key stayed on vLLM's command line in clear, and vLLM stopped at each start (a -0.5 too:
    loose_negative). Joined to its flag (`--api-key=--Zq...`), it is its value for both."""
    return [word for flag, value in zip(pairs[::2], pairs[1::2], strict=True)
            for word in ((f"{flag}={value}",) if value.startswith("-") else (flag, value))]


# --- vLLM's own words inside vllm.command -------------------------------------------------
#
# vllm.command is the argv prefix that starts vLLM's server, and a prefix may go on with
# vLLM's flags (["vllm", "serve", "--uds", "/tmp/s"]): they reach vLLM before ours, so each
# is judged as one in extra_args, and a key there would stay on the command line in clear.

_ENTRY_MODULES = ("vllm.entrypoints.openai.api_server",)


def command_tail(command: Sequence[str]) -> int | None:
    """The index of the first word vLLM's parser reads in vllm.command (after `vllm serve`,
    `-m vllm.entrypoints.cli.main serve` or `-m vllm.entrypoints.openai.api_server`); None
    when the command does not show where vLLM begins (a shell, a container)."""
    for i, word in enumerate(command[1:], start=1):
        before = command[i - 1]
        if word == "serve" and (before.rpartition("/")[2] == "vllm"
                                or before == "vllm.entrypoints.cli.main"):
            return i + 1
        if before == "-m" and word in _ENTRY_MODULES:
            return i + 1
    return None


def command_problems(command: Sequence[str], model: str) -> list[Problem]:
    """vLLM's flags written in vllm.command, judged as in extra_args; a key there (it would
    stay on vLLM's argv, for `ps` to show) and a positional (vLLM serves it instead of
    vllm.model) refused. The model named there as vllm.model names it (`vllm serve /m`,
    `--model /m`: a file that ran before this check) passes."""
    start = command_tail(command)
    if start is None:
        return []
    words = list(command[start:])  # vllm.model named again: what vLLM serves is vllm.model
    for i, word in enumerate(words):  # (blanked: vllm.command's own words are never blank)
        if word == f"--model={model}":
            words[i] = ""
        elif word == model and i > 0 and words[i - 1] == "--model":
            words[i - 1] = words[i] = ""
        elif word == model and flagnames.positional(words, i):
            words[i] = ""
    tail = long_forms(words)
    out: list[Problem] = []
    for i, token in enumerate(tail):
        key = f"vllm.command[{start + i}]"
        name = flag_name(token[2:].partition("=")[0]) if token.startswith("--") else ""
        if name in SECRET_FLAGS:
            out.append(Problem(key, f"the {name} flag written in vllm.command stays on vLLM's "
                               "command line in clear (any local user's `ps` shows it); "
                               + ("use vllm.api_key_file" if name == "api-key" else
                                  f"set {SECRET_FLAGS[name]} in [vllm.env]")))
        elif token.strip() and not token.startswith("-") and flagnames.positional(tail, i):
            out.append(Problem(key, f"{token!r} after the server's name is a model to vLLM, "
                               "which serves it instead of vllm.model (and vllmwatch checks, "
                               "warms and probes the other); set vllm.model and remove it"))
    said = {p.key for p in out}  # (a word named as a second model, once; and a switch before
    said |= {f"vllm.command[{start + i - 1}]" for i, w in enumerate(tail) if flagnames.positional(
        tail, i, switch=True) and (not w or f"vllm.command[{start + i}]" in said)}  # it/model)
    return out + [p for p in args_problems({}, words, where="vllm.command", offset=start)
                  if not p.problem.startswith("an empty word") and p.key not in said]
