"""Pure: config -> the argv and environment of the vLLM child. Never a shell string."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from vllmwatch.config import flags, safefile, serveline
from vllmwatch.config.errors import Problem
from vllmwatch.config.flags import flag_name as flag_name  # re-exported for callers
from vllmwatch.config.launch import FORK_VARIABLE, engine_start_method, env_file_secrets

# vllm.env_file's reader lives apart (launch.py: vllmflags judges the flags in it, and
# command imports vllmflags); re-exported for callers
from vllmwatch.config.launch import KEY_READ_TIMEOUT as KEY_READ_TIMEOUT
from vllmwatch.config.launch import MAX_KEY as MAX_KEY
from vllmwatch.config.launch import KeyFileError as KeyFileError
from vllmwatch.config.launch import read_env_file as read_env_file
from vllmwatch.config.launch import redact_argv as redact_argv

# The rules live in config/redact.py; re-exported for the callers that know them here.
from vllmwatch.config.redact import REDACT
from vllmwatch.config.redact import REDACTED as REDACTED
from vllmwatch.config.redact import is_secret_name as is_secret_name
from vllmwatch.config.schema import Config, ConfigError, load
from vllmwatch.config.secretnames import path_value

# Variables that belong to our own unit and must never reach the child: a child that could
# notify systemd or ping our watchdog would let a dead vllmwatch look alive.
_STRIP_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
              "LISTEN_FDNAMES", "VLLMWATCH_CONFIG")


class CommandError(ConfigError):
    """A vLLM flag that we know will fail, refused before launch."""


@dataclass(frozen=True)
class ChildCommand:
    """What to execute: argv, the full environment, and which variables are secret."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    shown_env: Mapping[str, str] = field(default_factory=dict)
    # Never shown: vllm.env_file's flags, secret flags' values, its credential-like variables
    hidden: frozenset[str] = frozenset()

    def display(self) -> str:
        """The command line for humans and logs, with secrets redacted (config/redact.py:
        secret names, and credentials inside other values such as a URL's password)."""
        prefix = " ".join(f"{k}={v if v == REDACTED else shlex.quote(REDACT.text(v))}"
                          for k, v in sorted(self.shown_env.items()))
        return (prefix + " " if prefix else "") + shlex.join(self.shown_argv())

    @property
    def api_key(self) -> str | None:
        """The key this vLLM enforces: it reads `args.api_key or VLLM_API_KEY`, and build()
        moves every --api-key value to VLLM_API_KEY, so the variable holds it from whichever
        source gave it (the key file, [vllm.args], [vllm.env], extra_args, vllm.env_file or
        our own environment). Every client of this engine sends it (probes, canary, smoke,
        adapters, the spare); an empty value is no key, as in vLLM."""
        return self.env.get("VLLM_API_KEY") or None

    @property
    def audio_body(self) -> int:
        """The largest request body with audio this vLLM takes, in bytes: its cap of an audio
        file, VLLM_MAX_AUDIO_CLIP_FILESIZE_MB (MiB, read with int(), 25 by default: vLLM 0.32
        envs.py) from whichever source set it, sent as base64 in a chat's input_audio (4/3 of
        it: multimodal/media/audio.py load_base64) or a transcription's upload, with 1 MiB
        beside (Starlette's cap of a form field). The gate reads bodies up to it (new_engine);
        a value int() refuses fails vLLM's first audio request: its default's then."""
        try:
            mib = max(0, int(self.env.get("VLLM_MAX_AUDIO_CLIP_FILESIZE_MB", "25")))
        except ValueError:
            mib = 25
        return 4 * ((mib * 2**20 + 2) // 3) + 2**20

    def shown_argv(self) -> list[str]:
        """argv with secrets redacted (config/redact.py's rules; values from vllm.env_file)."""
        return REDACT.argv([REDACTED if a in self.hidden else a for a in self.argv])


def args_to_argv(args: Mapping[str, object], path: str = "<config>") -> list[str]:
    """Translate the [vllm.args] table to flags: true -> --f, false -> --no-f, tables -> JSON.

    Raises CommandError listing every refused flag.
    """
    _raise(path, flags.args_problems(args, ()))
    out: list[str] = []
    for key, value in args.items():
        name = flag_name(key)
        if value is True:
            out.append(f"--{name}")
        elif value is False:
            out.append(f"--no-{name}")
        elif isinstance(value, (dict, list)):
            out += [f"--{name}", json.dumps(value, separators=(",", ":"))]
        else:  # -0.5 joined: vLLM takes it alone for a flag or JSON key (flags.loose_negative)
            out += [f"--{name}={value}"] if f"{value}"[:1] == "-" else [f"--{name}", f"{value}"]
    return out


def check_extra_args(extra: list[str], path: str = "<config>") -> None:
    """Refuse legacy flags and malformed JSON among verbatim extra_args (all at once)."""
    _raise(path, flags.args_problems({}, extra))


def _raise(path: str, problems: list[Problem]) -> None:
    if problems:
        first, *rest = problems
        raise CommandError(path, first.key, first.problem, first.line, rest)


def split_secrets(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Move the values of secret flags (--hf-token, --api-key) from argv to the environment.

    A bare flag (--hf-token with no value: use the cached login) stays in argv.
    """
    out: list[str] = []
    env: dict[str, str] = {}
    skip = False
    for i, token in enumerate(argv):
        if skip:
            skip = False
            continue
        name, eq, inline = token[2:].partition("=") if token.startswith("--") else ("", "", "")
        variable = flags.SECRET_FLAGS.get(flag_name(name)) if name else None
        value = inline if eq else flags.next_value(argv, i)
        if variable is None or value is True:
            out.append(token)
            continue
        env[variable] = str(value)
        skip = not eq
    return out, env


def read_api_key(config: Config) -> str | None:
    """Read vllm.api_key_file (or [vllm.args] api-key); None when neither is set. Only what
    build() takes as its `api_key`: the key vLLM enforces may come from elsewhere too
    ([vllm.env], extra_args, vllm.env_file): a client asks effective_api_key or
    ChildCommand.api_key, never this."""
    path = config.vllm.api_key_file
    in_args = {flag_name(k): v for k, v in config.vllm.args.items()}.get("api-key")
    if path and in_args is not None:
        raise ConfigError(config.path, "vllm.args.api-key", "set twice: also by "
                          "vllm.api_key_file; keep one (the file keeps the key out of the config)")
    if isinstance(in_args, str) and in_args:
        return in_args
    if not path:
        return None
    try:
        # (a byte-order mark is no part of the key: Notepad's UTF-8, refused as non-ASCII)
        key = safefile.read_within(path, MAX_KEY, KEY_READ_TIMEOUT).decode("utf-8-sig").strip()
    except safefile.FileProblem as exc:
        raise KeyFileError(config.path, "vllm.api_key_file", f"{exc}; check the path and "
                           "that the service user may read it", transient=exc.transient) \
            from None
    except UnicodeDecodeError as exc:  # (stays so: a rotation renames a whole file in)
        raise KeyFileError(config.path, "vllm.api_key_file", f"{path!r} is not UTF-8 text "
                           f"({exc.reason} at byte {exc.start})", transient=False) from None
    if not key:
        raise KeyFileError(config.path, "vllm.api_key_file", f"{path!r} is empty (a key "
                           "rotation in progress?)", transient=True)
    if "\0" in key:  # else `check` passes and the launch's Popen raises ValueError
        raise KeyFileError(config.path, "vllm.api_key_file", f"{path!r} holds a NUL byte, "
                           "which cannot reach vLLM's environment", transient=False)
    # Quotes (a shell's, a .env's) reached vLLM as part of the key, and our probes sent the
    # same: vllmwatch saw a healthy vLLM while every client got 401
    if len(key) > 1 and key[0] == key[-1] and key[0] in "\"'":
        raise KeyFileError(config.path, "vllm.api_key_file", f"{path!r} holds the key in "
                           "quotes, which vLLM would take as part of it; remove them",
                           transient=False)
    return key


def effective_api_key(config: Config, base_env: Mapping[str, str]) -> str | None:
    """The key the next launch's vLLM enforces, computed as the launch does (the key file and
    vllm.env_file read now); raises what read_api_key and build raise."""
    return build(config, base_env, api_key=read_api_key(config)).api_key


def file_inputs(config: Config, api_key: str | None) -> tuple[tuple[str, str], ...]:
    """What a launch reads from files the config only names, as (part, sha256): a key
    rotation rewrites them in place, so a reload compares these, not the config's text.
    Raises what read_env_file raises (a reload's worker: then unknown, not compared)."""
    env, args = read_env_file(config)
    return (("the API key", hashlib.sha256((api_key or "").encode()).hexdigest()),
            ("vllm.env_file's contents", hashlib.sha256(json.dumps(
                [sorted(env.items()), args]).encode()).hexdigest()))


def accepts_shutdown_timeout(version: str | None) -> bool:
    """vLLM >= 0.18 drains in-flight requests on SIGTERM when given --shutdown-timeout."""
    if not version:
        return False
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        return False
    return (int(match.group(1)), int(match.group(2))) >= (0, 18)


def build(config: Config, base_env: Mapping[str, str], api_key: str | None = None,
          vllm_version: str | None = None, extra_env: Mapping[str, str] | None = None
          ) -> ChildCommand:
    """Build the child's argv and environment; raise CommandError for known-broken flags."""
    v = config.vllm
    argv = [*v.command, *model_words(v.command, v.model)]
    if v.served_model_name:
        argv += ["--served-model-name", v.served_model_name]
    argv += ["--host", v.host, "--port", str(v.port)]
    _raise(config.path, flags.args_problems(v.args, v.extra_args, vllm_version))
    file_env, file_args = read_env_file(config)
    if file_env or file_args:  # vllm.env_file's lines, judged as the tables are (its module
        from vllmwatch.config.envfilechecks import env_file_problems  # only then)

        _raise(config.path, env_file_problems(config, file_env, file_args, vllm_version))
    user, secret_env = split_secrets([*args_to_argv(v.args, config.path), *v.extra_args,
                                      *flags.pair_words(file_args)])
    secret_env = {**file_env, **secret_env}
    argv += user
    lora_env: dict[str, str] = {}
    if config.adapters:  # [[adapters]] (issue 38): imported only when configured
        from vllmwatch.config import adapters
        if adapters.RUNTIME_VARIABLE in file_env:  # it would win over lora.live
            _raise(config.path, [Problem(f"vllm.env_file: {adapters.RUNTIME_VARIABLE}",
                                         "is set by vllmwatch from lora.live when "
                                         "[[adapters]] is configured; remove it there")])
        argv += adapters.launch_args(config)
        lora_env = adapters.launch_env(config)
    given = {flag_name(a.partition("=")[0]) for a in argv if a.startswith("--")}
    if accepts_shutdown_timeout(vllm_version) and "shutdown-timeout" not in given:
        argv += ["--shutdown-timeout", str(int(config.restart.drain_timeout))]
    shown: dict[str, str] = {}
    if v.gpus is not None:
        # NVML numbers GPUs by PCI bus; CUDA by default fastest-first. Make them agree so
        # that CUDA_VISIBLE_DEVICES and our NVML sampling name the same devices.
        shown["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        shown["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in v.gpus)
    shown.update(extra_env or {})
    shown.update(lora_env)
    shown.update(v.env)
    # EngineCore by fork for one worker (config/launch.py says when and why).
    method, _ = engine_start_method(v.args, [*v.extra_args, *file_args], {**base_env, **v.env})
    if method is not None:
        shown[FORK_VARIABLE] = method
    env = {k: val for k, val in base_env.items() if k not in _STRIP_ENV}
    env.update(shown)
    env.setdefault("PYTHONUNBUFFERED", "1")
    for name, value in secret_env.items():
        env[name] = value
        shown[name] = REDACTED
    if api_key is not None:
        env["VLLM_API_KEY"] = api_key
        shown["VLLM_API_KEY"] = REDACTED
    if (key := env.get("VLLM_API_KEY")) is not None and not (  # a key no client can use:
            key.isascii() and key.isprintable() and key == key.strip() != ""):  # (only then)
        from vllmwatch.config import keyform
        _raise(config.path, keyform.problems(env, keyform.source(config, file_env, file_args)))
    shown = {k: (REDACTED if is_secret_name(k) and not path_value(val) else val)
             for k, val in shown.items()}  # (GOOGLE_APPLICATION_CREDENTIALS=/etc/gcp/sa.json)
    return ChildCommand(argv=tuple(argv), env=env, shown_env=shown,
                        hidden=frozenset([*file_args[1::2], *env_file_secrets(secret_env)]))


def model_words(command: list[str] | tuple[str, ...], model: str) -> list[str]:
    """How the model is named on the command line: `vllm serve MODEL` (positional: vLLM 0.32
    warns at every launch that `--model` will be removed), `--model MODEL` for every other
    form (the `api_server` module, a wrapper, the fake vLLM), which has no positional."""
    words = list(command)
    if words and words[-1] == "serve" and serveline.program_end(words) == len(words):
        return [model]
    return ["--model", model]


def load_for_reload(path: str) -> Config:
    """The config at path, loaded and validated the way a SIGHUP applies it; ConfigError when
    a reload would refuse it (issue 36.9).

    Shared by the daemon's reload (on its worker thread) and `vllmwatch check --config-only`,
    which the units run as the first `ExecReload=` before the signal: a config the daemon
    would refuse then fails `systemctl reload` itself, instead of a reload that "succeeds"
    while the daemon keeps the old config and only logs why. The API key file is read too: a
    key file that can never work (a directory, a FIFO) is refused now, not at the next
    launch; one that is briefly missing or empty (a key rotation replaces the file) is not,
    as the daemon retries it. So is vllm.env_file, with the checks the launch makes of it (a
    directory, a line that is not NAME=value, a flag or variable vllmwatch owns). A file
    that is not there at all is refused: a rotation never removes the path.
    """
    config = load(path)
    # Missing is not a rotation (one renames a new file into place: the path never goes): a
    # typo applied would restart vLLM into launches that fail until someone notices
    _raise(path, [Problem(f"vllm.{name}", f"{file!r}: file not found; create it before the "
                          "reload (a key rotation renames a new file into place)")
                  for name, file in (("api_key_file", config.vllm.api_key_file),
                                     ("env_file", config.vllm.env_file))
                  if file and not os.path.lexists(file)])
    key: str | None = None
    try:
        key = read_api_key(config)
    except KeyFileError as exc:
        if not exc.transient:
            raise
    # The flags the launch refuses (fatal: the daemon would stop a healthy vLLM for a config
    # it then cannot start): the known-bad ones, and those this vLLM's cached flag list lacks
    from vllmwatch.config import vllmflags, vllminfo  # (at reload and check only)

    v = config.vllm
    problems = flags.args_problems(v.args, v.extra_args)
    vllminfo.step(vllminfo.VERSION)  # runs an interpreter: a deadline of its own (shell/reload.py)
    version = vllminfo.version(v.command)
    vllminfo.step(vllminfo.READ)
    known = vllmflags.known_flags(v.command, version, vllmflags.default_cache_dir(
        config, os.environ), ask=False) if version else None
    _raise(path, problems + (vllmflags.validate_args(config, known) if known else []))
    _raise(path, vllminfo.launch_problems(config, os.environ))
    try:  # the command as the launch builds it: vllm.env_file read and checked, as there
        build(config, os.environ, api_key=key, vllm_version=version)
    except KeyFileError as exc:
        if not exc.transient:
            raise
    return config
