"""Pure: config -> the argv and environment of the vLLM child. Never a shell string."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vllmwatch.config.schema import Config, ConfigError

# Variables that belong to our own unit and must never reach the child: a child that could
# notify systemd or ping our watchdog would let a dead vllmwatch look alive.
_STRIP_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
              "LISTEN_FDNAMES", "VLLMWATCH_CONFIG")
_OWNED_FLAGS = {
    "model": "vllm.model",
    "port": "vllm.port",
    "host": "vllm.host",
    "served-model-name": "vllm.served_model_name",
    "api-key": "vllm.api_key_file (the key is passed through the environment, not argv)",
}
_SECRET_WORDS = ("key", "token", "secret", "password")
_KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
REDACTED = "<redacted>"


class CommandError(ConfigError):
    """A vLLM flag that we know will fail, refused before launch."""


@dataclass(frozen=True)
class ChildCommand:
    """What to execute: argv, the full environment, and which variables are secret."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    shown_env: Mapping[str, str] = field(default_factory=dict)

    def display(self) -> str:
        """The command line for humans and logs, with secrets redacted."""
        prefix = " ".join(f"{k}={v if v == REDACTED else shlex.quote(v)}"
                          for k, v in sorted(self.shown_env.items()))
        return (prefix + " " if prefix else "") + shlex.join(redact_argv(self.argv))


def flag_name(key: str) -> str:
    """Normalise a flag name: no dashes in front, dashes instead of underscores."""
    return key.lstrip("-").replace("_", "-")


def args_to_argv(args: Mapping[str, object], path: str = "<config>") -> list[str]:
    """Translate the [vllm.args] table to flags: true -> --f, false -> --no-f, tables -> JSON."""
    out: list[str] = []
    for key, value in args.items():
        name = flag_name(key)
        _refuse_legacy(name, value, path, f"vllm.args.{key}")
        if value is True:
            out.append(f"--{name}")
        elif value is False:
            out.append(f"--no-{name}")
        elif isinstance(value, (dict, list)):
            out += [f"--{name}", json.dumps(value, separators=(",", ":"))]
        else:
            out += [f"--{name}", str(value)]
    return out


def check_extra_args(extra: list[str], path: str = "<config>") -> None:
    """Refuse legacy flags and malformed JSON among verbatim extra_args."""
    for i, token in enumerate(extra):
        key = f"vllm.extra_args[{i}]"
        if token.startswith("--"):
            name, _, inline = token[2:].partition("=")
            value: object = inline if inline else _next_value(extra, i)
            _refuse_legacy(flag_name(name), value, path, key)
        elif token.lstrip().startswith(("{", "[")):
            _check_json(token, path, key)
        if "=" in token and token.startswith("--"):
            inline = token.partition("=")[2]
            if inline.lstrip().startswith(("{", "[")):
                _check_json(inline, path, key)


def _next_value(extra: list[str], i: int) -> object:
    if i + 1 < len(extra) and not extra[i + 1].startswith("--"):
        return extra[i + 1]
    return True


def _check_json(text: str, path: str, key: str) -> None:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(path, key, f"bad JSON {text!r}: {exc.msg} at column {exc.colno}; "
                           "in [vllm.args] write it as a TOML table instead, e.g. "
                           "hf-overrides = { rope_parameters = { rope_type = \"yarn\" } }"
                           ) from None


def _refuse_legacy(name: str, value: object, path: str, key: str) -> None:
    """The flags a widely copied guide gets wrong, each with its modern replacement."""
    if name in _OWNED_FLAGS:
        raise CommandError(path, key, f"--{name} is set by vllmwatch; use {_OWNED_FLAGS[name]}")
    if name in ("rope-scaling", "rope-theta"):
        raise CommandError(path, key, f"--{name} was removed from vLLM; use hf-overrides = "
                           "{ rope_parameters = { rope_type = \"yarn\", factor = 4.0, "
                           "original_max_position_embeddings = 32768 } } in [vllm.args]")
    if name == "disable-logprobs-during-spec-decoding":
        raise CommandError(path, key, "--disable-logprobs-during-spec-decoding was removed from "
                           "vLLM; delete it (nothing replaces it)")
    if name == "device":
        raise CommandError(path, key, "--device was removed from vLLM, which picks the platform "
                           "itself; choose GPUs with vllm.gpus = [0, 1] instead")
    if name == "kv-cache-dtype" and isinstance(value, str) and value not in _KV_CACHE_DTYPES:
        hint = " (fp16 is not a choice: \"auto\" keeps the model's dtype)" if value in (
            "fp16", "float16", "half") else ""
        raise CommandError(path, key, f"--kv-cache-dtype {value!r} is not accepted{hint}; "
                           f"choose one of {', '.join(_KV_CACHE_DTYPES)}")
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        raise CommandError(path, key, f"--{name} is a boolean flag and takes no value "
                           f"{value!r}; in [vllm.args] write {name} = true (--{name}) or "
                           f"{name} = false (--no-{name})")
    if isinstance(value, str) and value.lstrip().startswith(("{", "[")):
        _check_json(value, path, key)


def read_api_key(config: Config) -> str | None:
    """Read vllm.api_key_file; None when no key is configured."""
    path = config.vllm.api_key_file
    if not path:
        return None
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(config.path, "vllm.api_key_file", f"cannot read {path!r}: "
                          f"{exc.strerror}; check the path and that the service user may "
                          "read it") from None
    if not key:
        raise ConfigError(config.path, "vllm.api_key_file", f"{path!r} is empty")
    return key


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
    argv = [*v.command, "--model", v.model]
    if v.served_model_name:
        argv += ["--served-model-name", v.served_model_name]
    argv += ["--host", v.host, "--port", str(v.port)]
    argv += args_to_argv(v.args, config.path)
    check_extra_args(v.extra_args, config.path)
    argv += v.extra_args
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
    shown.update(v.env)
    env = {k: val for k, val in base_env.items() if k not in _STRIP_ENV}
    env.update(shown)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if api_key is not None:
        env["VLLM_API_KEY"] = api_key
        shown["VLLM_API_KEY"] = REDACTED
    shown = {k: (REDACTED if _is_secret(k) else val) for k, val in shown.items()}
    return ChildCommand(argv=tuple(argv), env=env, shown_env=shown)


def _is_secret(name: str) -> bool:
    return any(word in name.lower() for word in _SECRET_WORDS)


def redact_argv(argv: tuple[str, ...] | list[str]) -> list[str]:
    """Replace the values of secret-looking flags (api-key, token, ...) with <redacted>."""
    out: list[str] = []
    hide_next = False
    for token in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if token.startswith("--") and _is_secret(token):
            name, eq, _ = token.partition("=")
            out.append(f"{name}={REDACTED}" if eq else token)
            hide_next = not eq
            continue
        out.append(token)
    return out
