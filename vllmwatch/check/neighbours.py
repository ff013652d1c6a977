"""Other vllmwatch instances on this box: two configs must not claim the same GPU or port.

The template unit (`vllmwatch@NAME`) reads /etc/vllmwatch/NAME.toml, so the neighbours of a
config are the other *.toml files in its directory. Two instances on one GPU starve each
other's KV cache (and each one's release gate would wait on the other's memory); two on one
port make the second fail to start.
"""

from __future__ import annotations

from pathlib import Path

from vllmwatch.check.base import FAIL, PASS, SKIP, CheckResult, Context
from vllmwatch.config.hosts import parse_listen
from vllmwatch.config.schema import Config, ConfigError, load


def _ports(c: Config) -> dict[int, str]:
    out = {c.vllm.port: "vllm.port"}
    listen = parse_listen(c.status.listen) if c.status.listen else None
    if listen is not None:
        out.setdefault(listen[1], "status.listen")
    return out


def _gpus(c: Config) -> set[int] | None:
    """The GPUs a config uses; None means every GPU (no `gpus` given)."""
    return None if c.vllm.gpus is None else set(c.vllm.gpus)


def clashes(mine: Config, other: Config) -> list[str]:
    """What two instances would fight over."""
    out = []
    theirs = _ports(other)
    for port, key in sorted(_ports(mine).items()):
        if port in theirs:
            out.append(f"port {port} ({key} here, {theirs[port]} there)")
    a, b = _gpus(mine), _gpus(other)
    if mine.vllm.uses_gpu and other.vllm.uses_gpu:
        if a is None or b is None:
            out.append("GPUs: one of them sets no vllm.gpus, so it takes every GPU; give each "
                       "instance its own `gpus = [...]`")
        elif a & b:
            out.append("GPU " + ", ".join(str(g) for g in sorted(a & b)))
    return out


def check_neighbours(ctx: Context) -> CheckResult:
    """FAIL when another config in the same directory claims one of our GPUs or ports."""
    here = Path(ctx.config.path) if ctx.config.path else None
    if here is None or not here.parent.is_dir():
        return CheckResult("instances", SKIP, "the config has no directory to look in")
    found: list[str] = []
    unreadable: list[str] = []
    others = sorted(p for p in here.parent.glob("*.toml") if p.resolve() != here.resolve())
    for path in others:
        try:
            other = load(str(path))
        except (ConfigError, OSError):
            unreadable.append(path.name)
            continue
        found += [f"{path.name}: {what}" for what in clashes(ctx.config, other)]
    if found:
        return CheckResult("instances", FAIL, "shared with another instance: " + "; ".join(found)
                           + " (each vllmwatch@NAME needs its own GPUs and ports)")
    detail = f"no clash with {len(others) - len(unreadable)} other config(s) in {here.parent}"
    if unreadable:
        detail += f" ({', '.join(unreadable)} not readable as vllmwatch configs: not compared)"
    return CheckResult("instances", PASS, detail)
