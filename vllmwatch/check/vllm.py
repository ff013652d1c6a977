"""Checks of the config itself and of the vLLM it launches: the command builds, vLLM is
installed, [vllm.args] holds only flags that this vLLM accepts, status.listen is usable."""

from __future__ import annotations

import contextlib
import json
import shlex
import socket

from vllmwatch.check import host as host_checks
from vllmwatch.check.base import FAIL, PASS, SKIP, WARN, CheckResult, Context, vllm_flags
from vllmwatch.config import command, hosts, startcaches, vllmflags, vllminfo
from vllmwatch.config.schema import ConfigError


def check_config(ctx: Context) -> CheckResult:
    """The config loads (done by run), the api key file reads and the command builds."""
    c = ctx.config
    try:
        cmd = command.build(c, ctx.env, api_key=command.read_api_key(c))
    except ConfigError as exc:
        return CheckResult("config", FAIL, str(exc))
    return CheckResult("config", PASS,
                       f"{c.path}: {shlex.join(cmd.shown_argv())}")


def check_vllm(ctx: Context) -> CheckResult:
    """The vLLM program is on PATH; its version from package metadata unless --fast."""
    cmd = ctx.config.vllm.command
    exe = vllminfo.executable(cmd)
    closed = vllminfo.unreachable(cmd[0]) if exe is None and "/" in cmd[0] else None
    if closed is not None:
        return CheckResult("vllm", FAIL, f"{cmd[0]}: {closed}")
    if exe is None:
        return CheckResult("vllm", FAIL, f"{cmd[0]!r} not found on PATH; install vLLM "
                           "(pip install vllm) or set vllm.command to its full path")
    broken = vllminfo.cannot_run(exe)
    if broken is not None:
        return CheckResult("vllm", FAIL, broken)
    if ctx.fast:
        return CheckResult("vllm", PASS, exe)
    ver = vllminfo.version(cmd)
    return CheckResult("vllm", PASS, f"{exe} (vLLM {ver})" if ver else f"{exe} (version unknown)")


def check_start_caches(ctx: Context) -> CheckResult:
    """vLLM's start-up caches (issue 33): what the next launch turns on, and an operator's
    VLLM_USE_STANDALONE_COMPILE=0 with the mega AOT artifact on refused (vLLM asserts)."""
    c = ctx.config
    # Also with --fast: this is the package-metadata read that check_vllm_args' version()
    # makes anyway (cached); without it a vLLM whose own default turns the artifact on
    # (torch >= 2.12) would pass here and be refused by `run` (exit 78).
    info = vllminfo.info(c.vllm.command)
    found = startcaches.problems(c, ctx.env, info)
    if found:
        return CheckResult("start caches", FAIL, f"{found[0].key}: {found[0].problem}")
    d = startcaches.decide(c, ctx.env, info, unified=False)
    return CheckResult("start caches", PASS, f"startup plan: {d.why['startup_plan']}; mega AOT "
                       f"artifact: {d.why['mega_aot_artifact']} (on unified memory `auto` "
                       "leaves the plan off)")


def check_vllm_args(ctx: Context) -> CheckResult:
    """Every [vllm.args] key and extra_args flag is one this vLLM accepts (asked of vLLM once
    and cached; with --fast only a cached answer is used)."""
    c = ctx.config
    version = vllminfo.version(c.vllm.command)
    if version is None:
        return CheckResult("vllm.args", WARN, "cannot tell which vLLM runs "
                           f"{shlex.join(c.vllm.command)}; [vllm.args] is not checked against "
                           "its flags")
    cache = ctx.flags_cache or vllmflags.default_cache_dir(c, ctx.env)
    known = vllmflags.known_flags(c.vllm.command, version, cache, ask=not ctx.fast)
    if known is None and ctx.fast:
        return CheckResult("vllm.args", SKIP, "vLLM's flag list is not cached yet; run "
                           "`vllmwatch check` without --fast once")
    if known is None:
        failed = vllmflags.failed_ask(c.vllm.command, version, cache)
        return CheckResult("vllm.args", WARN, f"cannot ask vLLM {version} for its flags "
                           f"({failed[1] if failed else 'import failed or took too long'}); "
                           "[vllm.args] is not checked")
    problems = vllmflags.validate_args(c, known)
    if problems:
        return CheckResult("vllm.args", FAIL, "; ".join(f"{p.key}: {p.problem}"
                                                        for p in problems))
    given = len(c.vllm.args) + sum(t.startswith("--") for t in c.vllm.extra_args)
    loose = "" if known.complete else (
        " (their values only loosely: this cached list, an older vllmwatch's, does not say how "
        "vLLM reads each; run `vllmwatch check` without --fast to renew it)")
    if str(vllm_flags(ctx).get("disable-log-stats", False)).lower() not in ("false", "0"):
        return CheckResult("vllm.args", WARN, f"{given} flag(s) accepted by vLLM {version}; "
                           "but --disable-log-stats leaves /metrics without vLLM's progress "
                           "series: vllmwatch cannot tell a busy engine from a hung one (a "
                           "canary that times out twice under load is a hang restart) and "
                           "the stall rule is off; remove it unless the engine runs idle")
    return CheckResult("vllm.args", PASS, f"{given} flag(s) accepted by vLLM {version}{loose}")


def check_relative_paths(ctx: Context) -> list[CheckResult]:
    """Values of [vllm.args], extra_args and [vllm.env] that are relative paths (./x, ../x,
    also after a flag's =, and inside a JSON value: a table's `cache_dir = "./c"`, extra_args'
    '{"model": "./draft"}'): vLLM opens them from the unit's WorkingDirectory=, not from the
    folder the config was written in (`chat-template = "./t.jinja"` stopped each start)."""
    v = ctx.config.vllm
    values = [*((f"vllm.args.{k}", x) for k, x in v.args.items()),
              *((f"vllm.extra_args[{i}]", x) for i, x in enumerate(v.extra_args)),
              *((f"vllm.env.{k}", x) for k, x in v.env.items())]
    found = [found for key, x in values for found in _relative(key, x)]
    if not found:
        return []
    return [CheckResult("relative paths", WARN, f"{', '.join(found)}: a path relative to the "
                        "folder vLLM starts in, the unit's WorkingDirectory= (/var/lib/vllmwatch "
                        "as shipped), not this one; write it from /")]


def _relative(key: str, value: object) -> list[str]:
    """The keys under `key` whose value is a relative path; a JSON text is read as JSON."""
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        with contextlib.suppress(ValueError):  # (not JSON: a plain word to judge)
            value = json.loads(value)
    if isinstance(value, dict):
        return [f for k, x in value.items() for f in _relative(f"{key}.{k}", x)]
    if isinstance(value, list):
        return [f for i, x in enumerate(value) for f in _relative(f"{key}[{i}]", x)]
    return [key] if isinstance(value, str) and (
        value.startswith(("./", "../")) or "=./" in value or "=../" in value) else []


def check_status_listen(ctx: Context) -> CheckResult:
    """status.listen is well formed (load checks that), resolves, and its port is free
    (or this instance's running vllmwatch holds it)."""
    s = ctx.config.status
    try:
        parsed = hosts.parse_listen(s.listen)
    except ValueError as exc:
        return CheckResult("status.listen", FAIL, f"{s.listen!r}: {exc}")
    if parsed is None:
        return CheckResult("status.listen", WARN, 'status.listen = "": no /livez, /readyz, '
                           "/status or /metrics; `vllmwatch status` will not work")
    host, port = parsed
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        return CheckResult("status.listen", FAIL, f"{s.listen!r}: cannot resolve {host!r} "
                           f"({exc}); use an address such as 127.0.0.1:{port}")
    address = str(infos[0][4][0])
    if not s.allow_remote and not hosts.is_loopback(address):
        return CheckResult("status.listen", FAIL, f"{s.listen!r} resolves to {address}, not "
                           f"a loopback address; use 127.0.0.1:{port} or set "
                           "status.allow_remote = true")
    return host_checks.listener(ctx, "status.listen", host, port)


def check_lora_live(ctx: Context) -> list[CheckResult]:
    """[[adapters]] with lora.live: what it opens on vLLM's port, said before the start (no
    row otherwise)."""
    c = ctx.config
    if not (c.adapters and c.lora.live):
        return []
    from vllmwatch.config.adapters import LIVE_OPEN  # (a config with adapters loaded it)

    return [CheckResult("lora.live", WARN, LIVE_OPEN)]
