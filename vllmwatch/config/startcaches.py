"""Pure: vLLM's own start-up caches, the variables that turn them on for the child (issue 33).

Two caches beyond the compile cache, both under VLLM_CACHE_ROOT (so under prewarm.cache_dir
with the compile caches: prewarm/runner.py places VLLM_CACHE_ROOT there):

- the startup plan (`VLLM_ENABLE_STARTUP_PLAN=1`, `VLLM_CACHE_ROOT/startup_plan/`): the KV
  cache size the last start profiled, keyed by config, vLLM version, device and torch/CUDA;
  applied only when free GPU memory at start is at least the recorded baseline, else vLLM
  profiles in full ("Startup plan not applied: ..."). GPU worker only: the CPU worker never
  reads it. Not in the compile-cache key, so turning it on costs no compile.
- the mega AOT artifact (`VLLM_USE_MEGA_AOT_ARTIFACT=1`): the whole compiled model in one
  artifact, so a start skips Dynamo's trace. vLLM turns it on itself for torch >= 2.12 (with
  AOT compile); on older torch it is an opt-in here (`true`), measured on the H200 with torch
  2.11 (docs/GPU.md). vLLM asserts VLLM_USE_STANDALONE_COMPILE=1 with it, so it is set with
  it, and an operator's 0 is refused (`problems`). It is part of the compile-cache key:
  turning it on (or off) is one compile-cache miss and one writing start.

`auto` for the plan: on for GPU launches on discrete memory where the installed vLLM has it.
Off on unified memory (DGX Spark): the free-memory figure the plan compares with its baseline
counts the page cache as used there, and the page cache moves between starts (weights read,
files written), so the plan would be skipped unpredictably or, worse, applied on a box whose
"free" figure rose only because the page cache was dropped: a fixed KV size is not safe where
the memory vLLM sees as free is not stable. The operator's own value ([vllm.env] or the
daemon's environment) always wins: nothing here overrides it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from vllmwatch.config.errors import Problem
from vllmwatch.config.sections import Config

PLAN = "VLLM_ENABLE_STARTUP_PLAN"
MEGA = "VLLM_USE_MEGA_AOT_ARTIFACT"
STANDALONE = "VLLM_USE_STANDALONE_COMPILE"
KNOWN = (PLAN, MEGA, STANDALONE)  # the names looked for in the installed vLLM's envs.py
MEGA_DEFAULT_TORCH = (2, 12)  # vLLM's own default is on from this torch (envs.py)
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


@dataclass(frozen=True)
class VllmInfo:
    """What the installed vLLM offers, read from its package without importing it."""

    version: str | None = None
    torch: str | None = None
    envs: frozenset[str] = field(default_factory=frozenset)  # names of KNOWN it defines
    origin: str | None = None  # its package's __init__.py: a reinstall changes it

    def has(self, name: str) -> bool:
        """Whether this vLLM reads the variable (False when unknown)."""
        return name in self.envs


@dataclass(frozen=True)
class Decision:
    """The variables to add to the child's environment, and one line per cache saying why."""

    env: dict[str, str]
    why: dict[str, str]


def torch_at_least(torch: str | None, want: tuple[int, int]) -> bool | None:
    """Whether a torch version such as "2.11.0+cu130" is >= want; None when unknown."""
    match = re.match(r"(\d+)\.(\d+)", torch or "")
    if match is None:
        return None
    return (int(match.group(1)), int(match.group(2))) >= want


def operator_value(config: Config, environ: Mapping[str, str], name: str) -> str | None:
    """The operator's own value of a variable: [vllm.env] over the daemon's environment."""
    if name in config.vllm.env:
        return config.vllm.env[name]
    return environ.get(name)


def is_on(value: str | None) -> bool:
    return value is not None and value.strip().lower() in _TRUE


def is_off(value: str | None) -> bool:
    return value is not None and value.strip().lower() in _FALSE


def decide(config: Config, environ: Mapping[str, str], info: VllmInfo,
           unified: bool) -> Decision:
    """The start-up cache variables for the next launch (never one the operator set)."""
    env: dict[str, str] = {}
    why: dict[str, str] = {}
    p = config.prewarm
    if not p.enabled:
        return Decision({}, {"startup_plan": "prewarm.enabled = false",
                             "mega_aot_artifact": "prewarm.enabled = false"})
    # -- the startup plan --
    if operator_value(config, environ, PLAN) is not None:
        why["startup_plan"] = f"{PLAN} set by the operator"
    elif p.startup_plan == "false":
        why["startup_plan"] = "prewarm.startup_plan = false"
    elif p.startup_plan == "true" and (info.has(PLAN) or info.version is None):
        env[PLAN] = "1"  # an unknown vLLM: the operator asked, and an unread variable is inert
        why["startup_plan"] = "prewarm.startup_plan = true"
    elif not info.has(PLAN):
        why["startup_plan"] = (f"vLLM {info.version} has no {PLAN}" if info.version else
                               "vLLM's version is unknown: left to vLLM")
    elif not config.vllm.uses_gpu:
        why["startup_plan"] = "a CPU config: vLLM's CPU worker never uses the plan"
    elif unified:
        why["startup_plan"] = ("unified memory: the free-memory figure the plan is checked "
                               "against moves with the page cache (set true to force it)")
    else:
        env[PLAN] = "1"
        why["startup_plan"] = "auto: a GPU launch on discrete memory"
    # -- the mega AOT artifact --
    new_torch = torch_at_least(info.torch, MEGA_DEFAULT_TORCH)
    if operator_value(config, environ, MEGA) is not None:
        why["mega_aot_artifact"] = f"{MEGA} set by the operator"
    elif p.mega_aot_artifact == "auto":
        why["mega_aot_artifact"] = (
            f"auto: vLLM's own default (on: torch {info.torch} >= 2.12)" if new_torch else
            f"auto: vLLM's own default (off: torch {info.torch or 'unknown'} < 2.12; "
            "set true to turn it on)")
    elif not info.has(MEGA) and info.version is not None:
        why["mega_aot_artifact"] = f"vLLM {info.version} has no {MEGA}"
    elif p.mega_aot_artifact == "true":
        env[MEGA] = "1"
        if operator_value(config, environ, STANDALONE) is None:
            env[STANDALONE] = "1"  # vLLM asserts it with the artifact
        why["mega_aot_artifact"] = "prewarm.mega_aot_artifact = true"
    else:
        env[MEGA] = "0"
        why["mega_aot_artifact"] = "prewarm.mega_aot_artifact = false"
    return Decision(env, why)


def artifact_on(config: Config, environ: Mapping[str, str], info: VllmInfo | None) -> bool:
    """Whether the child will run with the mega AOT artifact (by anyone's choice)."""
    own = operator_value(config, environ, MEGA)
    if own is not None:
        return is_on(own)
    if not config.prewarm.enabled or config.prewarm.mega_aot_artifact == "auto":
        # vLLM's own default (envs.py use_mega_aot_artifact): torch >= 2.12 with AOT compile,
        # which is off when the operator turns it or the compile cache off
        aot_off = is_off(operator_value(config, environ, "VLLM_USE_AOT_COMPILE")) or \
            is_on(operator_value(config, environ, "VLLM_DISABLE_COMPILE_CACHE"))
        return bool(info and info.has(MEGA) and not aot_off
                    and torch_at_least(info.torch, MEGA_DEFAULT_TORCH))
    return config.prewarm.mega_aot_artifact == "true"


def problems(config: Config, environ: Mapping[str, str],
             info: VllmInfo | None = None) -> list[Problem]:
    """An operator's VLLM_USE_STANDALONE_COMPILE=0 with the mega AOT artifact on: vLLM would
    fail its start on an assertion; refused before the launch, naming what to change."""
    standalone = operator_value(config, environ, STANDALONE)
    if not is_off(standalone) or not artifact_on(config, environ, info):
        return []
    where = "vllm.env" if STANDALONE in config.vllm.env else "the daemon's environment"
    own_mega = operator_value(config, environ, MEGA)
    by = (f"{MEGA}={own_mega}" if own_mega is not None else
          "prewarm.mega_aot_artifact = true" if config.prewarm.mega_aot_artifact == "true"
          else f"vLLM's own default for torch {info.torch if info else ''} >= 2.12")
    key = f"vllm.env.{STANDALONE}" if where == "vllm.env" else "prewarm.mega_aot_artifact"
    return [Problem(key, f"{STANDALONE}={standalone} (in {where}) with the mega AOT artifact "
                    f"on ({by}): vLLM refuses to start (it needs {STANDALONE}=1 for the "
                    f"artifact); remove {STANDALONE} or set prewarm.mega_aot_artifact = false")]
