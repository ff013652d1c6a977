"""Checks across a config's sections (keys that must agree with each other), run after every
key was converted on its own; each problem names the key to change."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from vllmwatch.config import flags
from vllmwatch.config.convert import show
from vllmwatch.config.errors import Problem
from vllmwatch.config.flags import flag_name
from vllmwatch.config.hosts import clashes, listen_problem, parse_address, parse_listen
from vllmwatch.config.sections import Config
from vllmwatch.config.startcaches import problems as startcache_problems


def cross_checks(config: Config) -> list[Problem]:
    """What no single key can say alone: required keys, and keys that must agree."""
    out = []
    if not config.vllm.model:
        out.append(Problem("vllm.model", "missing; set it to a local model directory "
                           "or a hub id, e.g. model = \"/srv/models/Qwen3.5-9B\""))
    elif config.vllm.model.startswith("~"):  # no hub id starts so; vLLM expands no ~
        out.append(Problem("vllm.model", f"bad value {show(config.vllm.model)}: vLLM does not "
                           "expand ~ (a shell does), and would ask the hub for that name; "
                           "write the path from /"))
    if not config.vllm.command:
        out.append(Problem("vllm.command", 'empty; expected e.g. ["vllm", "serve"]'))
    if config.restart.backoff_max < config.restart.backoff_initial:
        out.append(Problem("restart.backoff_max", "must be >= restart.backoff_initial "
                           f"({config.restart.backoff_initial:g}s)"))
    why = listen_problem(config.status.listen, config.status.allow_remote)
    if why is not None:
        out.append(Problem("status.listen", f"bad value {config.status.listen!r}: {why}"))
    return out + _canary_checks(config) + _gate_checks(config) + _address_checks(config) \
        + startcache_problems(config, {}) + _spare_checks(config) + _env_checks(config) \
        + _misplaced(config) + secret_twice(config, {}, []) + _gpu_count(config) \
        + flags.command_problems(config.vllm.command, config.vllm.model)


def _gpu_count(config: Config) -> list[Problem]:
    """vllm.gpus that cannot hold the engines of one node: vLLM puts each tensor-, pipeline-
    and data-parallel rank on a GPU of its own (CUDA_VISIBLE_DEVICES is vllm.gpus), and with
    fewer every start failed (a crash loop) while the load passed. Only where the list is
    given (`None` is every GPU, `check`'s gpu row counts them; [] is a CPU config), and only
    for one node: with another node, Ray or a data-parallel rank of its own, the ranks here
    are fewer than the sizes say, and vLLM itself judges them."""
    if not config.vllm.gpus:
        return []
    from vllmwatch.config.launch import parallel_sizes

    given = flags.table(config.vllm.args, config.vllm.extra_args)
    if any(name in given for name in _MANY_NODES) or str(given.get("nnodes", 1)) != "1" or \
            given.get("distributed-executor-backend") not in (None, "mp", "uni"):
        return []
    sizes = parallel_sizes(config.vllm.args, config.vllm.extra_args)
    need, have = sizes["tp"] * sizes["pp"] * sizes["dp"], len(config.vllm.gpus)
    if need <= have:
        return []
    listed = ", ".join(str(g) for g in config.vllm.gpus)
    return [Problem("vllm.gpus", f"{have} GPU(s) ({listed}) for tensor-parallel-size "
                    f"{sizes['tp']} x pipeline-parallel-size {sizes['pp']} x "
                    f"data-parallel-size {sizes['dp']} = {need} ranks, one GPU each: vLLM "
                    f"would fail every start; list {need} GPUs, or lower the sizes")]


# Flags of a deployment over more than this machine (or ranks placed by another launcher):
# the sizes then count other nodes' GPUs too.
_MANY_NODES = ("node-rank", "data-parallel-size-local",
               "data-parallel-rank", "data-parallel-address", "data-parallel-start-rank",
               "data-parallel-external-lb", "data-parallel-hybrid-lb", "headless")


def secret_twice(config: Config, file_env: Mapping[str, str],
                 file_args: list[str]) -> list[Problem]:
    """The API key or hub token given in two places (vllm.api_key_file, [vllm.args],
    [vllm.env], vllm.extra_args, vllm.env_file): one silently won over the other, and a
    client holding the other key got 401. Also an api-key that is not one key as text."""
    out = []
    args = {flag_name(k): val for k, val in config.vllm.args.items()}
    for flag, variable in flags.SECRET_FLAGS.items():
        where = secret_sources(config, flag, file_env, file_args)
        if len(where) > 1:
            out.append(Problem(where[1], f"sets {variable} a second time (also {where[0]}); "
                               "keep one: vllm.api_key_file or vllm.env_file keeps it out "
                               "of the config"))
        if flag == "api-key" and not isinstance(args.get(flag, ""), str):
            out.append(Problem("vllm.args.api-key", "takes one key as text; vllmwatch hands "
                               "vLLM one key (VLLM_API_KEY): put it in vllm.api_key_file"))
    return out


def secret_sources(config: Config, flag: str, file_env: Mapping[str, str],
                   file_args: Sequence[str]) -> list[str]:
    """The config keys that give the value of a secret flag (api-key, hf-token): where the
    key or token comes from (secret_twice refuses two; config/keyform.py names the one)."""
    v, variable = config.vllm, flags.SECRET_FLAGS[flag]
    given = [a.partition("=")[0][2:] for a in v.extra_args if a.startswith("--")]
    return [key for key, present in [
        ("vllm.api_key_file", flag == "api-key" and bool(v.api_key_file)),
        (f"vllm.args.{flag}", {flag_name(k): val for k, val in v.args.items()}.get(
            flag, True) is not True),
        (f"vllm.env.{variable}", variable in v.env),
        ("vllm.extra_args", flag in map(flag_name, given)),
        (f"vllm.env_file: {variable}", variable in file_env),
        ("vllm.env_file: --" + flag, f"--{flag}" in file_args[::2])] if present]


# Keys of [vllm] that no vLLM has as a flag: under [vllm.args] (TOML gives every key after a
# table's header to that table) one became `--api-key-file PATH`, and no key was read.
_VLLM_KEYS = ("command", "gpus", "api_key_file", "env_file", "extra_args", "env")


def _misplaced(config: Config) -> list[Problem]:
    ours = {flag_name(k): k for k in _VLLM_KEYS}
    return [Problem(f"vllm.args.{key}", f"is a key of [vllm] ({ours[flag_name(key)]}), not "
                    "a vLLM flag: TOML gives every key after the [vllm.args] header to that "
                    "table; move it above [vllm.env] and [vllm.args]")
            for key in config.vllm.args if flag_name(key) in ours]


# vLLM reads these with int() when it uses them, after the weights have loaded (the API
# server's start): a value it cannot parse costs a whole start, then a crash loop.
INT_VARIABLES = {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "whole seconds, e.g. \"5\" (vLLM's default)"}


_SYSTEMD = "systemd's, for vllmwatch alone: vLLM never sees it"
# Variables vllmwatch owns in vLLM's environment, with why one of the operator's would break
# something: systemd's, our own markers, and vLLM's dev mode.
OWNED_ENV = {
    **{name: _SYSTEMD for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID",
                                   "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")},
    "VLLMWATCH_CONFIG": "vllmwatch's own: vLLM never sees it",
    "VLLMWATCH_INSTANCE": "vllmwatch's mark of its own processes (the sweeps of leftovers)",
    "VLLM_SERVER_DEV_MODE": "it opens vLLM's dev endpoints (/sleep, /collective_rpc, ...) on "
                            "its port, to every local user and without the API key; "
                            "vllmwatch gives them only to the spare, on a private socket",
}
_BY_GPUS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def owned_env_problem(name: str, config: Config, key: str) -> Problem | None:
    """A variable of [vllm.env] or vllm.env_file (the problem's `key`) that vllmwatch sets
    or keeps from vLLM; None when it is the operator's."""
    if name in OWNED_ENV:
        return Problem(key, f"belongs to vllmwatch, not to vLLM's environment: "
                       f"{OWNED_ENV[name]}; remove it")
    if name in _BY_GPUS and config.vllm.gpus is not None:
        return Problem(key, f"is set by vllmwatch from vllm.gpus {config.vllm.gpus}, which its "
                       "memory rules and checks read: remove it here, or set vllm.gpus = "
                       '"all" to pass your own (MIG UUIDs)')
    return None


def _env_checks(config: Config) -> list[Problem]:
    """[vllm.env] values vLLM is known to refuse, named with what it accepts; the variables
    vllmwatch owns."""
    out = [p for name in config.vllm.env
           if (p := owned_env_problem(name, config, f"vllm.env.{name}")) is not None]
    for name, accepted in INT_VARIABLES.items():
        value = config.vllm.env.get(name)
        if value is None:
            continue
        try:
            int(value.strip())
        except ValueError:
            out.append(Problem(f"vllm.env.{name}", f"bad value {show(value)}: vLLM reads it "
                               f"as a whole number and stops its start on anything else; "
                               f"expected {accepted}"))
    return out


def _address_checks(config: Config) -> list[Problem]:
    """vllm.port, status.listen and gate.listen are three different sockets (issue 23)."""
    listeners = [("vllm.port", config.vllm.host, config.vllm.port)]
    for key, text in (("status.listen", config.status.listen),
                      ("gate.listen", config.gate.listen if config.gate.enabled else "")):
        try:
            parsed = parse_listen(text)
        except ValueError:
            continue  # reported by its own check
        if parsed is not None:
            listeners.append((key, *parsed))
    # gate.listen on vllm.port has its own message in _gate_checks.
    return [Problem(key, why) for key, why in clashes(listeners)
            if not (key == "gate.listen" and "vllm.port" in why)]


# ---- issue 16 (canary kinds); kept apart from the checks above ----

MAX_CANARY_PROMPT = 1000  # characters: a canary needs a token's answer, not a context


def _canary_checks(config: Config) -> list[Problem]:
    """probe.canary = "custom" needs a path; a body, when given, is a JSON object."""
    p, out = config.probe, []
    if not p.canary_prompt.strip():  # vLLM: 400 "prompt ... must be provided and non-empty"
        out.append(Problem("probe.canary_prompt", f"bad value {show(p.canary_prompt)}: vLLM "
                           "refuses an empty prompt (HTTP 400), so no canary would pass and "
                           'vLLM would never be READY; write a few words, e.g. "Hello"'))
    elif len(p.canary_prompt) > MAX_CANARY_PROMPT:
        out.append(Problem("probe.canary_prompt", f"{len(p.canary_prompt)} characters; at "
                           f"most {MAX_CANARY_PROMPT}: every canary sends it (every "
                           f"{p.canary_interval:g}s), and past max-model-len vLLM refuses it "
                           "(HTTP 400) and is never READY; a few words suffice"))
    if p.canary == "custom" and not p.canary_path.startswith("/"):
        out.append(Problem("probe.canary_path", f"bad value {show(p.canary_path)}; "
                           'probe.canary = "custom" needs a path such as "/v1/embeddings"'))
    elif p.canary_path and not all("\x20" < ch < "\x7f" for ch in p.canary_path):
        # never sent (the HTTP request line refuses it): every canary fails, no READY
        out.append(Problem("probe.canary_path", f"bad value {show(p.canary_path)}: a space, "
                           "control or non-ASCII character cannot be sent in a request "
                           "line; percent-encode it (a space is %20)"))
    if p.canary_body:
        try:
            body = json.loads(p.canary_body, parse_constant=_no_constant)
        except ValueError as exc:
            body = {}  # reported here; not again below
            out.append(Problem("probe.canary_body", f"not JSON ({exc}); expected a JSON "
                               'object such as \'{"model": "m", "input": "Hello"}\''))
        if not isinstance(body, dict):
            out.append(Problem("probe.canary_body", f"bad value {show(p.canary_body)}; "
                               "expected a JSON object"))
    if (p.canary_path or p.canary_body) and p.canary != "custom":
        out.append(Problem("probe.canary", f"is {show(p.canary)} but canary_path or "
                           'canary_body is set; set probe.canary = "custom" to use them'))
    return out


def _no_constant(name: str) -> object:
    """NaN and Infinity: Python's JSON reads them, a server's strict parser refuses them."""
    raise ValueError(f"{name} is not JSON")


# ---- issue 15 (the [gate] front door); kept apart from the checks above ----

def _gate_checks(config: Config) -> list[Problem]:
    """gate.listen is a HOST:PORT that is not vLLM's own."""
    g = config.gate
    if not g.enabled:
        return []
    try:
        host, port = parse_address(g.listen)
    except ValueError as exc:
        return [Problem("gate.listen", f"bad value {show(g.listen)}: {exc}")]
    # the same socket by any name (localhost, 127.0.0.1, a wildcard on either side)
    if clashes([("vllm.port", config.vllm.host, config.vllm.port), ("gate.listen", host, port)]):
        return [Problem("gate.listen", f"port {port} is vllm.port; the gate takes the public "
                        "port and vLLM moves to a private one: set vllm.port to another port, "
                        "e.g. 8001")]
    return []


# ---- issue 34 (the [spare] engine); kept apart from the checks above ----

def _spare_checks(config: Config) -> list[Problem]:
    """spare.enabled = true where the config alone rules a spare out (no gate, CPU, unified
    memory, TP x PP > 1): refused at load, naming what to change. `auto` is never refused: it
    is off, saying why (config/spare.py)."""
    if config.spare.enabled != "true":
        return []
    from vllmwatch.config import spare  # lazy: `run` at the defaults never plans a spare
    from vllmwatch.config.launch import parallel_sizes

    args: dict[str, object] = {flag_name(k): v for k, v in config.vllm.args.items()}
    sizes = parallel_sizes(args, config.vllm.extra_args)  # extra_args' sizes count too
    args.update({"tensor-parallel-size": sizes["tp"], "pipeline-parallel-size": sizes["pp"]})
    found = spare.static_problem(config.spare, config.gate.enabled, args,
                                 cpu=not config.vllm.uses_gpu,
                                 unified=config.memory.unified == "true")
    if found is None:
        return []
    why, todo = found
    return [Problem("spare.enabled", f"is true but {why}; {todo}")]
