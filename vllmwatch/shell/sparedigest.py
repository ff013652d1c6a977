"""What of a spare's command a reload may change, each part digested (the core compares
them, core/failover.py, and names the part that changed; the key itself never leaves here)."""

from __future__ import annotations

import hashlib
import json

from vllmwatch.core import failover
from vllmwatch.shell.sparetree import SpareCommand


def _sha(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def digest(cmd: SpareCommand) -> failover.Inputs:
    """The parts of a spare's command that a reload may change, each digested (the core
    compares them and names the part that changed; the key itself never leaves here)."""
    env = {k: v for k, v in cmd.env.items() if k not in ("VLLM_API_KEY", "CUDA_VISIBLE_DEVICES")}
    argv, modules = _without_adapters(list(cmd.argv))
    return ((failover.COMMAND, _sha(argv)), (failover.ADAPTERS, _sha(modules)),
            ("the environment", _sha(env)),
            ("the API key", _sha(cmd.api_key or "")),
            ("the GPU list", _sha(cmd.env.get("CUDA_VISIBLE_DEVICES", ""))))


# What [[adapters]] and [lora] add (config/adapters.launch_args) is a part of its own: a change
# the reload applies live (an adapter less also moves the automatic --max-loras) relaunches no
# serving engine; one that needs a launch is core/lora.py's decision, not this digest's.
_ADAPTER_FLAGS = {"--enable-lora": 0, "--max-loras": 1, "--max-lora-rank": 1}


def _without_adapters(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the command without the adapters' flags, those flags)."""
    rest, ours, i = [], [], 0
    while i < len(argv):
        end = i + 1 + _ADAPTER_FLAGS.get(argv[i], -1) if argv[i] != "--lora-modules" else next(
            (j for j in range(i + 1, len(argv)) if argv[j].startswith("--")), len(argv))
        if end == i:  # not one of them
            rest.append(argv[i])
            end = i + 1
        else:
            ours += argv[i:end]
        i = end
    return rest, ours
