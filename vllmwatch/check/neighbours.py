"""Other vllmwatch instances on this box: two configs must not claim the same GPU or port.

The template unit (`vllmwatch@NAME`) reads /etc/vllmwatch/NAME.toml, so the neighbours of a
config are the other *.toml files in its directory. Two instances on one GPU starve each
other's KV cache (and each one's release gate would wait on the other's memory); two on one
port make the second fail to start. Two CPU instances (`gpus = []`) whose vLLM workers bind to
the same cores starve each other's start (vLLM's default "auto" binding picks the same cores
for every instance): a WARN, since the binding may also come from the unit's environment.
"""

from __future__ import annotations

from pathlib import Path

from vllmwatch.check.base import FAIL, PASS, SKIP, WARN, CheckResult, Context
from vllmwatch.config.hosts import parse_listen
from vllmwatch.config.schema import Config, ConfigError, load


def _ports(c: Config) -> dict[int, str]:
    out = {c.vllm.port: "vllm.port"}
    for key, value in (("status.listen", c.status.listen),
                       ("gate.listen", c.gate.listen if c.gate.enabled else "")):
        listen = parse_listen(value) if value else None
        if listen is not None:  # the gate's port is where clients come: two cannot share it
            out.setdefault(listen[1], key)
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


BIND = "VLLM_CPU_OMP_THREADS_BIND"
DEFAULT = "vllmwatch.toml"  # vllmwatch.service's config; the template reads NAME.toml


def cpu_binding(c: Config) -> set[int] | None:
    """The CPUs a CPU instance's vLLM workers bind to; None when vLLM picks ("auto", unset,
    or a value we cannot read); an empty set for "nobind" (no binding, nothing to share)."""
    value = c.vllm.env.get(BIND, "auto").strip()
    if value == "nobind":
        return set()
    cpus: set[int] = set()
    try:
        for part in value.replace("|", ",").split(","):
            lo, _, hi = part.strip().partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        return None
    return cpus


def shared_cpus(mine: Config, other: Config) -> str | None:
    """Why two CPU instances' workers would share cores, or None."""
    if mine.vllm.uses_gpu or other.vllm.uses_gpu:
        return None
    a, b = cpu_binding(mine), cpu_binding(other)
    if a is None or b is None:
        return (f"both run vLLM on the CPU and {BIND} is not set to distinct CPUs in [vllm.env] "
                "(vLLM's \"auto\" binds every instance to the same cores)")
    if a & b:
        return f"both bind vLLM's CPU workers to CPU {', '.join(str(x) for x in sorted(a & b))}"
    return None


def check_neighbours(ctx: Context) -> CheckResult:
    """FAIL when another config in the same directory claims one of our GPUs or ports."""
    here = Path(ctx.config.path) if ctx.config.path else None
    if here is None or not here.parent.is_dir():
        return CheckResult("instances", SKIP, "the config has no directory to look in")
    found: list[str] = []
    maybe: list[str] = []  # with vllmwatch.service's own config
    cores: list[str] = []
    unreadable: list[str] = []
    others = sorted(p for p in here.parent.glob("*.toml") if p.resolve() != here.resolve())
    for path in others:
        try:
            other = load(str(path))
        except (ConfigError, OSError):
            unreadable.append(path.name)
            continue
        what = [f"{path.name}: {w}" for w in clashes(ctx.config, other)]
        # vllmwatch.toml is vllmwatch.service's (the package ships it): beside the template's
        # instances it clashes only while that unit runs, so a WARN that says so
        default = DEFAULT in (path.name, here.name) and path.name != here.name
        (maybe if default else found).extend(what)
        why = shared_cpus(ctx.config, other)
        if why is not None:
            cores.append(f"{path.name}: {why}")
    if found:
        return CheckResult("instances", FAIL, "shared with another instance: " + "; ".join(found)
                           + " (each vllmwatch@NAME needs its own GPUs and ports)")
    if maybe:
        return CheckResult("instances", WARN, "shared with " + "; ".join(maybe) + f" ({DEFAULT} "
                           "is vllmwatch.service's config: fine while that unit does not run "
                           "beside the vllmwatch@NAME instances; systemctl disable --now "
                           "vllmwatch)")
    if cores:
        return CheckResult("instances", WARN, "; ".join(cores) + f": set {BIND} in [vllm.env] "
                           "of each to its own CPUs (e.g. \"0-7\" and \"8-15\"), or an idle "
                           "instance's spinning worker starves the other's start")
    detail = f"no clash with {len(others) - len(unreadable)} other config(s) in {here.parent}"
    if unreadable:
        detail += f" ({', '.join(unreadable)} not readable as vllmwatch configs: not compared)"
    return CheckResult("instances", PASS, detail)
