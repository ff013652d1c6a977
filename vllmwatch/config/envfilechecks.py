"""Pure: vllm.env_file's entries checked as [vllm.args] and [vllm.env] are, at the launch and
at `check` alike (both read the file through command.build). Its values are secrets: every
problem names the variable (or the flag), never the value."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from vllmwatch.config import flags, startcaches
from vllmwatch.config.crosschecks import INT_VARIABLES, owned_env_problem, secret_twice
from vllmwatch.config.errors import Problem
from vllmwatch.config.flags import ARG_PREFIX, flag_name
from vllmwatch.config.launch import FORK_VARIABLE, KeyFileError, read_env_file
from vllmwatch.config.sections import Config

# vllmflags.flag_problem and its FlagSet, passed in: vllmflags calls known_flag_problems, and
# an import of it here (even for a type) is a circle
Known = TypeVar("Known")

WHERE = "vllm.env_file: "


def arg_key(flag: str) -> str:
    """The problem's key for a flag the env file gives (`--max-model-len`)."""
    return WHERE + ARG_PREFIX + flag[2:].upper().replace("-", "_")


def env_file_problems(config: Config, file_env: Mapping[str, str], file_args: list[str],
                      vllm_version: str | None) -> list[Problem]:
    """Every refusal of vllm.env_file's entries (command.read_env_file's env and args)."""
    # Variables vllmwatch decides, with the operator's [vllm.env] value winning where it
    # says so: from the env file (applied last, unseen by `check` and the decision's log)
    # one would win unannounced, e.g. VLLM_USE_STANDALONE_COMPILE=0 beside the AOT artifact.
    out = [Problem(WHERE + name, "is read by vllmwatch's own decision (check, the launch's "
                   "log); set it in [vllm.env]")
           for name in (*startcaches.KNOWN, FORK_VARIABLE) if name in file_env]
    out += [p for name in file_env
            if (p := owned_env_problem(name, config, WHERE + name)) is not None]
    out += [p for p in (flags.flag_problem(a[2:], None, arg_key(a), vllm_version)
                        for a in file_args[::2]) if p is not None]
    out += secret_twice(config, file_env, file_args)
    said = {p.key for p in out}
    # The env file is applied after [vllm.env]: its value would win, and the command line
    # shows both <redacted> (the key or token twice: said by secret_twice above)
    out += [Problem(WHERE + name, f"is set in [vllm.env] too (vllm.env.{name}), and the env "
                    "file's value would win unseen; keep one")
            for name in file_env if name in config.vllm.env and WHERE + name not in said
            and name not in flags.SECRET_FLAGS.values()]
    for name, accepted in INT_VARIABLES.items():
        value = file_env.get(name)
        if value is not None and not _is_int(value):
            out.append(Problem(WHERE + name, "is not a whole number (the value is not shown): "
                               "vLLM reads it as one and stops its start on anything else; "
                               f"expected {accepted}"))
    return out + _flag_twice(config, file_args) + _quoted(file_env, file_args)


def _quoted(file_env: Mapping[str, str], file_args: list[str]) -> list[Problem]:
    """A value in quotes (`HF_TOKEN="hf_..."`, as a shell, a .env or systemd's
    EnvironmentFile= is written): this file has no quoting, so the quotes reached vLLM as
    part of the value: a hub token refused with 401, or an API key that vLLM (and our own
    probes, which send the same) took with its quotes while clients got 401."""
    pairs = zip(file_args[::2], file_args[1::2], strict=True)  # (read_env_file: in pairs)
    values = [*file_env.items(), *((arg_key(flag), value) for flag, value in pairs)]
    return [Problem(name if name.startswith(WHERE) else WHERE + name,
                    "has its value in quotes, which vLLM would get as part of it (this file "
                    "is NAME=value with no quoting: the value is the rest of the line); "
                    "remove the quotes")
            for name, value in values
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'"]


def _is_int(value: str) -> bool:
    try:
        int(value.strip())
    except ValueError:
        return False
    return True


def _flag_twice(config: Config, file_args: list[str]) -> list[Problem]:
    """A flag of the env file that [vllm.args] or extra_args sets too: vLLM takes the last
    (the env file's) while vllmwatch (the spare's plan, check) reads the table's, as flags.
    _twice refuses between those two. Repeats within the file are left alone (append flags,
    as init writes them); one that extra_args gives too only if vLLM keeps each."""
    by = {flag_name(k): f"vllm.args.{k}" for k in config.vllm.args}
    for i, token in enumerate(flags.long_forms(config.vllm.extra_args)):  # (-tp too)
        name = flag_name(token.partition("=")[0]) if token.startswith("--") else ""
        if name and name not in by and name not in flags.APPEND_FLAGS:
            by[name] = f"vllm.extra_args[{i}]"
    out, seen = [], set(flags.SECRET_FLAGS)  # (the key or token twice: secret_twice's)
    for flag in file_args[::2]:
        name = flag_name(flag)
        if name in by and name not in seen:
            seen.add(name)
            out.append(Problem(arg_key(flag), f"--{name} is set by {by[name]} too (vLLM "
                               "would take the env file's, the last one); keep one"))
    return out


def known_flag_problems(config: Config, known: Known,
                        judge: Callable[[str, object, str, Known], Problem | None]
                        ) -> list[Problem]:
    """vllm.env_file's flags judged by this vLLM's flag list as [vllm.args]' are (vllmflags:
    an unknown flag, a value its reader refuses), the value never shown. `check` said
    `VLLMWATCH_ARG_MAX_MODEL_LENGTH=8192` was fine and vLLM stopped at every launch."""
    try:
        _, args = read_env_file(config)
    except KeyFileError:  # (command.build says why the file cannot be read)
        return []
    out = []
    for flag, value in zip(args[::2], args[1::2], strict=True):
        p = judge(flag_name(flag[2:]), value, arg_key(flag), known)
        if p is not None:  # the value (a secret: quoted or not) as <value>; one or two
            # characters are no secret, and replacing them would garble the text
            text = p.problem.replace(repr(value), "<value>") if value else p.problem
            out.append(Problem(p.key, text.replace(value, "<value>") if len(value) > 2 else text))
    return out
