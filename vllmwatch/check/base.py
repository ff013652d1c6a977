"""The types every check shares: CheckResult, Context and the four statuses.

Checks import this module and nothing of the runner, so the runner can import every check
at the top (no import circle).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from vllmwatch.config import flags
from vllmwatch.config.schema import Config

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"


@dataclass(frozen=True)
class CheckResult:
    """One line of the checklist. status is PASS, WARN, FAIL or SKIP (not run; not a failure)."""

    name: str
    status: str
    detail: str


@dataclass
class Context:
    """What the checks may look at: the config, the child's environment and the seams."""

    config: Config
    fast: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    nvml: Callable[[], Any] | None = None  # returns a pynvml-like module, or None
    progress: TextIO | None = None
    flags_cache: str | None = None  # where vLLM's flag list is cached; None: the default
    scan_root: str = "/"  # where `fights` looks for crontabs, units, supervisord (tests: tmp)
    proc_root: str = "/proc"


Check = Callable[[Context], "CheckResult | list[CheckResult]"]


def exc_text(exc: BaseException) -> str:
    """'TypeError: message', for a check that crashed."""
    return f"{type(exc).__name__}: {exc}"


def vllm_flags(ctx: Context) -> dict[str, object]:
    """[vllm.args] and extra_args as one {flag-name: value} table (config/flags.table)."""
    return flags.table(ctx.config.vllm.args, ctx.config.vllm.extra_args)
