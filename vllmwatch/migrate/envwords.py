"""Pure: the environment of a hand-run vLLM -> vllm.gpus and [vllm.env]; secrets (an API key,
a hub token) never written in clear: the key goes to vllm.api_key_file, with the command that
creates the file for the person to run."""

from __future__ import annotations

import shlex

from vllmwatch.migrate.draft import Draft, Entry, Facts
from vllmwatch.migrate.flagwords import Given

SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "credential", "auth",
                "private")
_HF_TOKENS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
_OURS = ("CUDA_DEVICE_ORDER", "PYTHONUNBUFFERED")  # vllmwatch sets these itself


def is_secret(name: str) -> bool:
    """A variable or flag whose value must not be written in clear."""
    return any(word in name.lower() for word in SECRET_WORDS)


def key_file_todo(path: str) -> str:
    """The commands that create the key file (the key typed, never shown or written here)."""
    q = shlex.quote(path)
    return (f"create {path} with the API key (the service user reads it, only root "
            f"writes it):\n    sudo install -m 0640 -o root -g vllmwatch /dev/null {q}\n"
            f"    sudoedit {q}    # paste the key (vLLM's --api-key value), save")


def api_key(source: str, draft: Draft, facts: Facts) -> None:
    """An API key seen in argv or the environment: vllm.api_key_file instead."""
    if "api_key_file" in draft.vllm:
        return
    draft.set("api_key_file", facts.api_key_file,
              f"the line's {source} (not written here: argv and configs are read by "
              "many): vllmwatch reads the key from this file and hands it to vLLM in "
              "VLLM_API_KEY")
    draft.todo.append(key_file_todo(facts.api_key_file))
    draft.changed += 1


def hf_token(source: str, draft: Draft) -> None:
    """A hub token: not written; the person puts it where only the service reads it."""
    draft.todo.append(
        f"the line's {source} is a Hugging Face token, not written here: put "
        "HF_TOKEN=... in a root-only file named by EnvironmentFile= in a drop-in "
        "(systemctl edit vllmwatch), or log in once as the service user "
        "(sudo -u vllmwatch huggingface-cli login)")
    draft.changed += 1


def secret_flag(given: Given, draft: Draft, facts: Facts) -> None:
    """--api-key KEY, --hf-token TOKEN."""
    shown = f"`--{given.name} <redacted>`" if given.values else f"`--{given.name}`"
    if given.name == "hf-token" and not given.values:
        draft.arg(Entry("hf-token", True))  # the cached login: nothing secret in it
    elif given.name == "hf-token":
        hf_token(shown, draft)
    else:
        api_key(shown, draft, facts)


def apply(env: dict[str, str], draft: Draft, facts: Facts) -> None:
    """Every variable into the draft: GPUs, secrets, vllmwatch's own, the rest to [vllm.env]."""
    for name, value in sorted(env.items()):
        if name == "CUDA_VISIBLE_DEVICES":
            _gpus(value, draft, facts)
        elif name == "VLLM_API_KEY":
            api_key("VLLM_API_KEY (environment)", draft, facts)
        elif name in _HF_TOKENS:
            hf_token(f"{name} (environment)", draft)
        elif is_secret(name):
            draft.todo.append(f"{name} looks secret and is not written here: give it to the "
                              "service in a root-only EnvironmentFile= drop-in if vLLM needs it")
            draft.changed += 1
        elif name in _OURS:
            if value != {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}.get(name, value):
                draft.errors.append(f"{name}={value}: vllmwatch sets {name}=PCI_BUS_ID so that "
                                    "GPU numbers are nvidia-smi's; check vllm.gpus")
        else:
            draft.env[name] = value


def _gpus(value: str, draft: Draft, facts: Facts) -> None:
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if all(p.isdigit() for p in parts):
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
