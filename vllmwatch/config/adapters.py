"""[[adapters]] and [lora] (issue 38): LoRA adapters that vLLM is launched with, so that every
restart comes back with them.

An adapter is `name`, `path` (a local directory holding adapter_config.json) and `required`
(default true: READY waits for it). Its files are read for their config only: the rank `r`
(and rank_pattern's largest) from adapter_config.json, at most MAX_ADAPTER_CONFIG bytes and
within READ_TIMEOUT for all of them, read at once (a hung mount fails the check, it never
hangs the reload worker or the daemon's start); the weights are vLLM's to read. The launch
adds --enable-lora, --lora-modules, --max-loras and --max-lora-rank (the largest r rounded up
to a rank vLLM accepts). Imported only when a
config has [[adapters]] (config/schema.py from_dict): a config without them costs nothing.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from vllmwatch.config import safefile
from vllmwatch.config.convert import show
from vllmwatch.config.errors import Problem, unknown
from vllmwatch.config.flags import flag_name
from vllmwatch.config.sections import AdapterConfig, Config

MAX_ADAPTERS = 64  # vLLM keeps each adapter's weights in CPU memory; more is a mistake
MAX_ADAPTER_CONFIG = 64 * 1024  # a PEFT adapter_config.json is ~1 KiB
READ_TIMEOUT = 5.0
# vLLM 0.32's accepted --max-lora-rank values: vllm/config/lora.py MaxLoRARanks.
RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Served names: no "=" or "," (--lora-modules' name=path form splits on them), no spaces.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")
KEYS = ("name", "path", "required")
RUNTIME_VARIABLE = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
# What RUNTIME_VARIABLE opens (vLLM 0.32 serve/lora/api_router.py), said at each launch and by
# `check`: vLLM's key middleware guards only /v1, /v2, /inference and /cohere.
LIVE_OPEN = ("lora.live = true: vLLM serves adapter load and unload on vllm.port (POST "
             "/v1/load_lora_adapter, and POST /adapters and DELETE /adapters/NAME, which "
             "vLLM's API key does not guard): any local user (any host that reaches vllm.host) "
             "can load an adapter from a path vLLM reads, or unload one; the gate never forwards "
             "them. Where others share this host, set lora.live = false (an adapter change "
             "then restarts vLLM, drained)")
# Flags vllmwatch sets when [[adapters]] is configured, and where the operator sets them
# instead: one source for each, so that every restart comes back the same.
OWNED_FLAGS = {"lora-modules": "[[adapters]]", "max-loras": "lora.max_loras",
               "max-lora-rank": "lora.max_lora_rank"}


class AdapterProblem(Exception):
    """An adapter directory that cannot be used (its message names the path)."""


def parse(value: object, config: Config) -> tuple[tuple[AdapterConfig, ...], list[Problem]]:
    """The [[adapters]] array checked: every entry's keys, files and rank; names unique."""
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        return (), [Problem("adapters", f"bad value {show(value)}; expected an array of "
                            'tables: [[adapters]] name = "sql" path = "/srv/lora/sql"')]
    problems: list[Problem] = []
    if len(value) > MAX_ADAPTERS:
        problems.append(Problem("adapters", f"{len(value)} adapters; accepted: at most "
                                f"{MAX_ADAPTERS}"))
    placed: list[tuple[int, AdapterConfig]] = []  # N counts the [[adapters]] from 1
    seen: dict[str, int] = {}
    ranks = read_ranks([t.get("path") for t in value[:MAX_ADAPTERS]])
    for i, table in enumerate(value[:MAX_ADAPTERS], 1):
        adapter = _entry(i, table, config, problems, ranks)
        if adapter is None:
            continue
        if adapter.name in seen:
            problems.append(Problem(f"adapters[{i}].name", f"{adapter.name!r} is also "
                                    f"adapters[{seen[adapter.name]}].name; names are unique"))
            continue
        seen[adapter.name] = i
        placed.append((i, adapter))
    return tuple(a for _, a in placed), problems + _lora_checks(config, placed)


def _entry(i: int, table: Mapping[str, object], config: Config, problems: list[Problem],
           ranks: Mapping[str, int | AdapterProblem]) -> AdapterConfig | None:
    key = f"adapters[{i}]"
    before = len(problems)
    problems += [unknown(f"{key}.", name, KEYS) for name in table if name not in KEYS]
    name, path, required = table.get("name"), table.get("path"), table.get("required", True)
    if name is None:
        problems.append(Problem(f"{key}.name", "missing; expected the name clients send as "
                                "\"model\""))
    elif not isinstance(name, str) or not NAME.fullmatch(name):
        problems.append(Problem(f"{key}.name", f"bad value {show(name)}; expected the name "
                                "clients send as \"model\": letters, digits and . _ : / @ + -, "
                                "at most 128, no spaces, '=' or ','"))
    elif name in (config.vllm.model_name, config.vllm.model):
        problems.append(Problem(f"{key}.name", f"{name!r} is the base model's name; vLLM "
                                "refuses an adapter named like a served model"))
    if not isinstance(required, bool):
        problems.append(Problem(f"{key}.required", f"bad value {show(required)}; expected "
                                "true or false"))
    rank = 0
    if not isinstance(path, str) or not path.startswith("/"):
        said = "missing" if path is None else f"bad value {show(path)}"
        problems.append(Problem(f"{key}.path", f"{said}; expected the absolute path of a "
                                "directory holding adapter_config.json"))
    else:
        read = ranks.get(path, AdapterProblem(f"{path!r}: not read"))
        if isinstance(read, AdapterProblem):
            problems.append(Problem(f"{key}.path", f"{read}; expected a PEFT LoRA adapter "
                                    "directory (adapter_config.json and its weights)"))
        else:
            rank = read
    if len(problems) > before:
        return None
    assert isinstance(name, str) and isinstance(path, str) and isinstance(required, bool)
    return AdapterConfig(name=name, path=path, required=required, rank=rank)


def read_ranks(paths: list[object]) -> dict[str, int | AdapterProblem]:
    """read_rank of every absolute path, all at once: the adapters on one hung mount cost
    READ_TIMEOUT in all. One after the other they cost it each (64 of them, 320 s: the
    daemon's start met systemd's TimeoutStartSec=120 before it said why; a SIGTERM during
    a reload's read waited for the reload worker)."""
    out: dict[str, int | AdapterProblem] = {}

    def one(path: str) -> None:
        try:
            out[path] = read_rank(path)
        except AdapterProblem as exc:
            out[path] = exc

    todo = {p for p in paths if isinstance(p, str) and p.startswith("/")}
    threads = [threading.Thread(target=one, args=(p,), name="vllmwatch-read", daemon=True)
               for p in sorted(todo)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + READ_TIMEOUT + 1.0  # each read_rank ends by READ_TIMEOUT
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return {p: out.get(p, AdapterProblem(
        f"{os.path.join(p, 'adapter_config.json')!r}: the read did not answer within "
        f"{READ_TIMEOUT:g}s (a hung network mount?)")) for p in todo}


def read_rank(path: str) -> int:
    """The adapter's largest rank: `r`, or a larger value of `rank_pattern`."""
    config_path = os.path.join(path, "adapter_config.json")
    try:
        raw = safefile.read_within(config_path, MAX_ADAPTER_CONFIG, READ_TIMEOUT)
    except safefile.FileProblem as exc:
        raise AdapterProblem(str(exc)) from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise AdapterProblem(f"{config_path!r} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise AdapterProblem(f"{config_path!r} is not a JSON object")
    pattern = data.get("rank_pattern")
    if pattern is not None and not isinstance(pattern, dict):
        raise AdapterProblem(f"{config_path!r}: \"rank_pattern\" must be an object of module "
                             f"name -> rank, got {show(pattern)}")
    named = [('"r"', data.get("r")), *((f'"rank_pattern"[{json.dumps(k)}]', v)
                                       for k, v in (pattern or {}).items())]
    for key, r in named:  # the one that is wrong, by name (not always "r")
        if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
            raise AdapterProblem(f"{config_path!r}: {key} must be a whole number >= 1, got "
                                 f"{show(r)}")
    return max(int(r) for _, r in named)


def round_rank(rank: int) -> int | None:
    """The smallest rank vLLM accepts that holds `rank`; None above 512."""
    return next((r for r in RANKS if r >= rank), None)


@dataclass(frozen=True)
class Plan:
    """What a launch gives vLLM for the configured adapters."""

    max_loras: int
    max_lora_rank: int
    largest_r: int  # the adapters' own largest rank (what max_lora_rank was rounded from)
    live: bool

    @property
    def rounded(self) -> bool:
        """The adapters' largest r was not itself a rank vLLM accepts."""
        return self.largest_r not in RANKS and self.largest_r > 0


def plan(config: Config) -> Plan:
    """max-loras and max-lora-rank for this config ([lora]'s overrides, else from the
    adapters); the config was validated, so the rank fits."""
    largest = max((a.rank for a in config.adapters), default=1)
    rank = config.lora.max_lora_rank or round_rank(largest) or RANKS[-1]
    return Plan(max_loras=config.lora.max_loras or max(1, len(config.adapters)),
                max_lora_rank=rank, largest_r=largest, live=config.lora.live)


def launch_args(config: Config) -> list[str]:
    """The flags that launch vLLM with the configured adapters."""
    p = plan(config)
    args = ["--enable-lora", "--max-loras", str(p.max_loras), "--max-lora-rank",
            str(p.max_lora_rank)]
    if config.adapters:
        args.append("--lora-modules")
        args += [module_word(a) for a in config.adapters]
    return args


def module_word(adapter: AdapterConfig) -> str:
    """One --lora-modules value: name=path, or vLLM's JSON form for a path with a comma or
    an "=" (vllm/entrypoints/launchers/cli_args.py LoRAParserAction reads name=path only
    when the value has an "=" and no ","; some versions split at every "=")."""
    if "," in adapter.path or "=" in adapter.path:
        return json.dumps({"name": adapter.name, "path": adapter.path})
    return f"{adapter.name}={adapter.path}"


def launch_env(config: Config) -> dict[str, str]:
    """The environment [lora] live = true needs: vLLM's load/unload endpoints."""
    return {RUNTIME_VARIABLE: "True"} if config.lora.live else {}


def _lora_checks(config: Config, placed: list[tuple[int, AdapterConfig]]) -> list[Problem]:
    out: list[Problem] = []
    lora = config.lora
    if lora.max_lora_rank and lora.max_lora_rank not in RANKS:
        out.append(Problem("lora.max_lora_rank", f"bad value {lora.max_lora_rank}; vLLM "
                           f"accepts only {', '.join(map(str, RANKS))}"))
    for i, a in placed:
        limit = lora.max_lora_rank or RANKS[-1]
        if a.rank > limit:
            key = "lora.max_lora_rank" if lora.max_lora_rank else f"adapters[{i}].path"
            out.append(Problem(key, f"adapter {a.name!r} has rank {a.rank}, above "
                               f"{limit}; raise lora.max_lora_rank (accepted: "
                               f"{', '.join(map(str, RANKS))})" if lora.max_lora_rank else
                               f"adapter {a.name!r} has rank {a.rank}; vLLM serves ranks "
                               f"up to {RANKS[-1]}"))
    return out + flag_problems(config)


def flag_problems(config: Config) -> list[Problem]:
    """[vllm.args] / extra_args that set what [[adapters]] and [lora] own: refused, since
    two sources for one setting is how a restart comes back different."""
    v, out = config.vllm, []
    given = [(f"vllm.args.{k}", flag_name(k)) for k in v.args]
    given += [(f"vllm.extra_args[{i}]", flag_name(t.partition("=")[0]))
              for i, t in enumerate(v.extra_args) if t.startswith("--")]
    for key, name in given:
        if name in OWNED_FLAGS:
            out.append(Problem(key, f"--{name} is set by vllmwatch when [[adapters]] is "
                               f"configured; use {OWNED_FLAGS[name]} instead"))
    if RUNTIME_VARIABLE in v.env:  # it would win over lora.live: a live unload then met no
        # endpoint (404) and was logged done while vLLM still served the adapter
        out.append(Problem(f"vllm.env.{RUNTIME_VARIABLE}", "is set by vllmwatch from "
                           "lora.live when [[adapters]] is configured; use lora.live instead"))
    return out
