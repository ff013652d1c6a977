"""The draft config `vllmwatch init` builds, and the facts about the machine it needs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from vllmwatch.config.vllmflags import FlagSet

SERVICE_USER = "vllmwatch"  # the units' User= (systemd/vllmwatch.service)


def _no_path(word: str) -> str | None:
    return None


def _no_file(path: str) -> bool:
    return False


@dataclass(frozen=True)
class Facts:
    """What the impure side learnt: vLLM's flags, where the key file goes, the machine."""

    known: FlagSet | None = None
    api_key_file: str = "/etc/vllmwatch/api-key"
    env_file: str = "/etc/vllmwatch/secrets.env"
    has_gpu: bool | None = None  # None: not known
    cwd: str | None = None
    gpu_index: Mapping[str, int] = field(default_factory=dict)  # GPU UUID -> NVML index
    resolve: Callable[[str], str | None] = _no_path  # a program -> its full path
    searched: bool = False  # resolve looked on a real PATH (None from it: not found)
    exists: Callable[[str], bool] = _no_file
    supervised: bool = False  # read from a vLLM that a vllmwatch launched (its marker set)
    injected: Mapping[str, str] = field(default_factory=dict)  # what that vllmwatch set
    gate: bool = False  # `init --gate`: vllmwatch's front door takes the line's address


@dataclass
class Entry:
    """One [vllm.args] line; written commented out when not active."""

    key: str
    value: object
    note: str = ""
    active: bool = True


@dataclass
class Draft:
    """The config to write, and what to tell the person."""

    vllm: dict[str, object] = field(default_factory=dict)
    vllm_notes: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    env_notes: dict[str, str] = field(default_factory=dict)
    args: list[Entry] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)
    sections: dict[str, dict[str, tuple[object, str]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    # Errors after which no config may be written: a secret of the line it cannot carry (a
    # config without the line's API key serves everyone who reaches the port)
    fatal: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)  # what init says beside the file
    api_key: str | None = None  # for vllm.api_key_file: written by init, never in the TOML
    secret_env: dict[str, str] = field(default_factory=dict)  # for vllm.env_file, likewise
    # A flag vLLM appends, given several times with a secret among them: one env_file line
    # each (VLLMWATCH_ARG_<FLAG>=value), in the line's order
    secret_args: list[tuple[str, str]] = field(default_factory=list)
    todo: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # words of the line dropped: comments
    changed: int = 0  # flags changed or dropped (each has a comment)
    positional_model: bool = False  # the line named its model positionally (vLLM's choice)
    # [[smoke]] checks proposed (migrate/smokeplan.py): (table, why, written active)
    smoke: list[tuple[dict[str, object], str, bool]] = field(default_factory=list)

    def set(self, key: str, value: object, note: str = "") -> None:
        """A [vllm] key, with the comment that says where it came from."""
        self.vllm[key] = value
        if note:
            self.vllm_notes[key] = note

    def put(self, section: str, key: str, value: object, note: str = "") -> None:
        """A key of another section ([gate], [drain]), with its comment."""
        self.sections.setdefault(section, {})[key] = (value, note)

    def arg(self, entry: Entry) -> None:
        """An [vllm.args] line; a note means a change (or a flag commented out)."""
        self.args = [e for e in self.args if e.key != entry.key]
        self.args.append(entry)
        self.changed += bool(entry.note)

    def refuse(self, raw: str, key: str, value: object, why: str, note: str = "") -> None:
        """A flag of the line that vLLM would refuse: an error, and its line commented out."""
        self.errors.append(f"{raw}: {why}")
        self.arg(Entry(key, value, f"{note}the line had `{raw}`: {why} (`run` would refuse "
                       "it)", False))
