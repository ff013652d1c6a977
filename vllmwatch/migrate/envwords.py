"""Pure: the environment of a hand-run vLLM -> vllm.gpus and [vllm.env]; secrets (an API key,
a hub token, a password in a URL) never in the TOML, and never masked either (the config must
still work): the key goes to vllm.api_key_file, other secrets to vllm.env_file, both written
by init with mode 0600 and named by the TOML (issue 37.1)."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping

from vllmwatch.config.redact import Redactor, is_secret_name
from vllmwatch.config.startcaches import MEGA, is_off, is_on
from vllmwatch.migrate.draft import Draft, Entry, Facts
from vllmwatch.migrate.flagwords import Given

SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "credential", "auth",
                "private")
_HF_TOKENS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
_OURS = ("CUDA_DEVICE_ORDER", "PYTHONUNBUFFERED")  # vllmwatch sets these itself


def is_secret(name: str) -> bool:
    """A variable or flag whose value must not be written in clear: by our words, or by the
    one redactor's rule (PGPASS, DB_PWD, SESSION_COOKIE: a value it would hide everywhere
    else must not sit in the TOML in clear)."""
    return any(word in name.lower() for word in SECRET_WORDS) or is_secret_name(name)


# A URL with a password in its userinfo (scheme://user:password@host): a secret whatever the
# variable or flag is called (DATABASE_URL, HTTPS_PROXY, --otlp-traces-endpoint).
_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s@:]*:[^/\s@]+@")


_RULES = Redactor(known=False)


def holds_secret(name: str, value: str) -> bool:
    """A variable or flag whose value must leave the TOML: by its name, or by its value when
    the one redactor would hide part of it (a password in a URL, `?token=...`, `hf_...`):
    what every log hides must not sit in the TOML in clear."""
    return is_secret(name) or bool(_USERINFO.search(value)) or _RULES.text(value) != value


def key_file_todo(path: str) -> str:
    """The commands that create the key file (the key typed, never shown or written here)."""
    q = shlex.quote(path)
    return (f"create {path} with the API key (the service user reads it, only root "
            f"writes it):\n    sudo install -m 0640 -o root -g vllmwatch /dev/null {q}\n"
            f"    sudoedit {q}    # paste the key (the value of vLLM's --api-key), save")


def api_key(source: str, value: str, draft: Draft, facts: Facts) -> None:
    """An API key seen in argv or the environment: into vllm.api_key_file (init writes the
    file, 0600); the flag's value wins over VLLM_API_KEY, as in vLLM. An empty one is no key:
    vLLM reads `args.api_key or VLLM_API_KEY` (so an empty flag leaves the variable's key),
    and an empty file would stop every start."""
    if not value:
        draft.said.append(f"{source} is empty: vLLM takes no key from it" + (
            "; the environment's VLLM_API_KEY stays the key, as in vLLM"
            if draft.api_key else ", and served without one: so does this config (set "
            "vllm.api_key_file to require a key)"))
        return
    if not _one_line(value, source, "vllm.api_key_file (one line, trimmed)", draft):
        return
    draft.api_key = value
    if "api_key_file" in draft.vllm:
        return
    draft.set("api_key_file", facts.api_key_file,
              f"the line's {source}, moved out of this file (argv and configs are read by "
              "many): vllmwatch reads the key from this file and hands it to vLLM in "
              "VLLM_API_KEY")
    draft.changed += 1


def _one_line(value: str, source: str, where: str, draft: Draft) -> bool:
    """Whether `where` carries the secret unchanged; else an error naming its source (the
    value is not shown). A line break made a file every launch refused, while init said it
    had written it; spaces at either end were trimmed off the secret."""
    if value == value.strip() and not any(c in value for c in "\r\n\0"):
        return True
    draft.fatal.append(f"{source}: its value has a line break or spaces at an end, which "
                       f"{where} cannot carry unchanged; put the secret there yourself in "
                       "the form vLLM should get, then run init again")
    return False


def to_env_file(name: str, value: str, source: str, draft: Draft, facts: Facts) -> None:
    """A secret variable (or a flag's secret value, as VLLMWATCH_ARG_<FLAG>): into
    vllm.env_file, which vllmwatch reads at each launch; the TOML names the file only."""
    if not _one_line(value, source, "vllm.env_file (one NAME=value line each, trimmed)",
                     draft):
        return
    draft.secret_env[name] = value
    draft.set("env_file", facts.env_file, "secrets of the line, moved out of this file: "
              f"{', '.join(sorted(draft.secret_env))} (NAME=value lines; vllmwatch reads "
              "them at each launch, never shows them)")
    # (no "secret:" in the words: the redactor would read the next word as the secret)
    draft.said.append(f"{source} goes to {facts.env_file} (mode 0600) as {name}, not to "
                      "the config, which many can read: it holds a secret")
    draft.changed += 1


def repeated_to_env_file(name: str, values: list[str], flag: str, draft: Draft,
                         facts: Facts) -> None:
    """A flag vLLM appends (--middleware), given several times with a secret among them: all
    of them to vllm.env_file, one line each in the line's order (the order is vLLM's)."""
    if not all(_one_line(v, f"the line's `--{flag}`", "vllm.env_file (one NAME=value line "
                                                        "each, trimmed)", draft) for v in values):
        return
    draft.secret_args += [(name, v) for v in values]
    draft.set("env_file", facts.env_file, "secrets of the line, moved out of this file "
              "(NAME=value lines; vllmwatch reads them at each launch, never shows them)")
    # (a secret flag's name in backticks, and no `secret: word`: the redactor takes the word
    # after either for its value, and the message read `--hf-token <redacted> given`)
    draft.said.append(f"`--{flag}` is given {len(values)} times and one holds a secret, so "
                      f"each goes to {facts.env_file} (mode 0600) as a {name} line, in the "
                      "line's order, not to the config")
    draft.changed += 1


def secret_flag(given: Given, draft: Draft, facts: Facts) -> None:
    """--api-key KEY, --hf-token TOKEN."""
    # (no <redacted> before a backtick: the redactor takes "<redacted>`" for a value)
    shown = f"`--{given.name}` and its value" if "".join(given.values) else \
        f"the line's `--{given.name}`"
    if given.name == "hf-token" and not given.values:
        draft.arg(Entry("hf-token", True))  # the cached login: nothing secret in it
    elif given.name == "hf-token":
        to_env_file("HF_TOKEN", " ".join(given.values), f"the line's {shown}", draft, facts)
    elif not given.values:  # `--api-key $KEY` with KEY unset: written, it served no key
        draft.fatal.append(f"`--{given.name}` has no value on the line: vLLM refuses it "
                           "(expected at least one argument), so this line never served; "
                           "give the key (is the variable that held it set?), then run init "
                           "again")
    elif len(given.values) > 1:  # vLLM takes each as a key; VLLM_API_KEY holds one
        draft.fatal.append(f"`--{given.name}` gives {len(given.values)} keys: vllmwatch hands "
                            "vLLM one (vllm.api_key_file, in VLLM_API_KEY), so every client "
                            "of the others would get 401; keep one key on the line (or put "
                            "a gate in front of the keys), then run init again")
    else:
        api_key(shown, " ".join(given.values), draft, facts)


def apply(env: dict[str, str], draft: Draft, facts: Facts) -> None:
    """Every variable into the draft: GPUs, secrets, vllmwatch's own, the rest to [vllm.env]."""
    for name, value in sorted(env.items()):
        if name == "CUDA_VISIBLE_DEVICES":
            _gpus(value, draft, facts)
        elif name == "VLLM_API_KEY":
            if draft.api_key is None:
                api_key("VLLM_API_KEY (environment)", value, draft, facts)
        elif name in _HF_TOKENS or holds_secret(name, value):
            to_env_file(name, value, f"{name} (environment)", draft, facts)
        elif name in _OURS:
            if value != {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}.get(name, value):
                draft.errors.append(f"{name}={value}: vllmwatch sets {name}=PCI_BUS_ID so that "
                                    "GPU numbers are nvidia-smi's; check vllm.gpus")
        elif facts.cwd and value.startswith(("./", "../")):  # (HF_HOME=./hf: a hub cache
            # under the service's WorkingDirectory, not the one the line used)
            draft.env[name] = os.path.normpath(os.path.join(facts.cwd, value))
            draft.said.append(f"{name}={value} was relative to {facts.cwd}; the service starts "
                              f"elsewhere: written as {draft.env[name]}")
        else:
            draft.env[name] = value
    _switches(facts.injected, draft)


def _switches(injected: Mapping[str, str], draft: Draft) -> None:
    """prewarm.mega_aot_artifact as the vllmwatch that supervised this vLLM had it. It sets
    the variable for true (1) or false (0), never for auto; dropped with the rest of what it
    set, the new config's auto turned the artifact on (torch >= 2.12) where the old config
    had it off (the 0.32 CPU build fails to load its own: every start compiled again), or off
    where it was on: the compile cache's key changes with it (one cold compile)."""
    value = injected.get(MEGA)
    word = True if is_on(value) else False if is_off(value) else None
    if word is not None:
        draft.put("prewarm", "mega_aot_artifact", word, f"{MEGA}={value}, which the vllmwatch "
                  "that supervised this vLLM set from its prewarm.mega_aot_artifact")


def _gpus(value: str, draft: Draft, facts: Facts) -> None:
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if all(p.isascii() and p.isdigit() for p in parts):
        draft.set("gpus", [int(p) for p in parts], f"from CUDA_VISIBLE_DEVICES={value}"
                  if parts else "CUDA_VISIBLE_DEVICES was empty: no GPU, a CPU deployment")
        return
    indexes = [facts.gpu_index.get(p) for p in parts]
    if parts and all(i is not None for i in indexes) and not any(
            p.startswith("MIG-") for p in parts):
        draft.set("gpus", [i for i in indexes if i is not None],
                  f"CUDA_VISIBLE_DEVICES={value} named GPUs by UUID; these are their indexes "
                  "(nvidia-smi's, as vllmwatch numbers them)")
        draft.changed += 1
        return
    # MIG instances (or UUIDs NVML does not know here) cannot be vllm.gpus indexes: pass
    # them through as they were; vllmwatch then watches every GPU's memory.
    draft.env["CUDA_VISIBLE_DEVICES"] = value
    draft.env_notes["CUDA_VISIBLE_DEVICES"] = (
        "MIG or unknown GPU ids: passed to vLLM as they were; vllm.gpus takes whole GPUs' "
        "indexes only, so it is left unset")
    draft.changed += 1
