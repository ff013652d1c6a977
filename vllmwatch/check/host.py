"""Checks of this machine: vllm.host:vllm.port is free (by the same rule `run` uses, and
recognising this instance's own running vLLM), so are status.listen and gate.listen
(recognising this instance's running vllmwatch), and the pre-warm cache directory is usable."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import psutil

from vllmwatch.check.base import FAIL, PASS, SKIP, WARN, CheckResult, Context
from vllmwatch.config import hosts
from vllmwatch.config.schema import DEFAULT_PATH
from vllmwatch.prewarm.runner import cache_env, cache_root, cannot_make
from vllmwatch.shell import child, groupfile, kin, ports, reloadports


def _own_child(pid: int | None, marker: str) -> bool:
    """The listener belongs to the vLLM tree of this instance (a running deployment): it or
    its session leader (the child vllmwatch spawned) carries the instance marker, or its
    session is the remembered group. Only a verdict for the checklist, never a reason to
    kill, so the marker counts whichever user runs the check (root, the service user)."""
    if pid is None:
        return False
    try:
        session = os.getsid(pid)
    except OSError:
        return False
    for candidate in {pid, session}:
        with contextlib.suppress(psutil.Error, OSError):
            if psutil.Process(candidate).environ().get(child.MARKER) == marker:
                return True
    return session == child.remembered_group(marker)


def serving_now(ctx: Context) -> bool:
    """This deployment's own vLLM holds vllm.port now (vllmwatch runs it)."""
    found = ports.holders(ctx.config.vllm.host, ctx.config.vllm.port)
    marker = child.instance_id(ctx.config.path)
    return bool(found) and all(_own_child(h.pid, marker) for h in found)


def whose_here(ctx: Context) -> reloadports.Whose:
    """Whose a listener is, for `check --config-only` (the units' first ExecReload=, another
    process than the daemon): this instance's running vllmwatch and its vLLM tree, known as
    the full check's port rows know them (a reload's own look: shell/reloadports.py)."""
    marker = child.instance_id(ctx.config.path)
    return lambda pid: ({reloadports.DAEMON} if _this_daemon(pid, ctx) else set()) | (
        {reloadports.TREE} if _own_child(pid, marker) else set())


def _this_daemon(pid: int, ctx: Context) -> bool:
    """A vllmwatch that runs this config: the instance lock's holder, the unit's MAINPID, or
    one whose --config (else $VLLMWATCH_CONFIG, else the default), from its working
    directory, is this file. Not the lock alone: a shell's check finds another lock than the
    unit's (its STATE_DIRECTORY)."""
    if _own_daemon(pid, ctx):
        return True
    if not _is_daemon(pid):
        return False
    if ctx.env.get("MAINPID") == str(pid):
        return True
    with contextlib.suppress(psutil.Error, OSError):
        proc = psutil.Process(pid)
        path = _config_of(proc.cmdline()) or proc.environ().get("VLLMWATCH_CONFIG") \
            or DEFAULT_PATH
        return os.path.realpath(os.path.join(proc.cwd(), path)) == os.path.realpath(
            ctx.config.path)
    return False


def _config_of(args: list[str]) -> str | None:
    """The config a vllmwatch's argv names, in any of the CLI's spellings (--config X,
    --config=X, an abbreviation such as --conf X, -c X, -cX, -c=X); the last one wins."""
    got = None
    for i, word in enumerate(args):
        name, eq, value = word.partition("=")
        if name == "-c" or (len(name) > 3 and "--config".startswith(name)):
            got = value if eq else (args[i + 1] if i + 1 < len(args) else got)
        elif word.startswith("-c") and not word.startswith("--") and len(word) > 2:
            got = word[2:]
    return got


def sees_ours(env: Mapping[str, str]) -> bool:
    """This check would see the sockets of this instance's vllmwatch and vLLM: run as root,
    or by the unit's ExecReload= (systemd sets MAINPID) as the daemon's user. Else a listener
    it cannot see may be ours (the service user's vLLM on the running vllm.port): not a
    refusal here; the daemon's own reload still refuses a foreign one."""
    if os.geteuid() == 0:
        return True
    with contextlib.suppress(psutil.Error, ValueError):
        return psutil.Process(int(env.get("MAINPID", ""))).uids().effective == os.geteuid()
    return False


def check_gate_beside(ctx: Context) -> list[CheckResult]:
    """With the gate on, vLLM listens on loopback only: its own port on the network beside
    the gate lets clients bypass it (and fail during every restart the gate would hide)."""
    c = ctx.config
    if not c.gate.enabled or hosts.is_loopback(c.vllm.host):
        return []
    return [CheckResult("gate", WARN, f"vllm.host = {c.vllm.host!r} puts vLLM's own port "
                        f"{c.vllm.port} on the network beside gate.listen = {c.gate.listen!r}: "
                        'clients there bypass the gate; set vllm.host = "127.0.0.1"')]


def check_port(ctx: Context) -> CheckResult:
    """vllm.host:vllm.port is free for vLLM; if not, name who holds it."""
    host, port = ctx.config.vllm.host, ctx.config.vllm.port
    where = f"{host}:{port}"
    if host and not ports.bind_addresses(host):
        return CheckResult("port", FAIL, f"vllm.host {host!r} does not resolve; use "
                           "127.0.0.1, 0.0.0.0 or one of this machine's addresses")
    found = ports.holders(host, port)
    if not found:
        return _bindable(host, port, where)
    marker = child.instance_id(ctx.config.path)
    if all(_own_child(h.pid, marker) for h in found):
        pids = ", ".join(child.describe_pid(h.pid) for h in found)
        return CheckResult("port", PASS, f"{where} is held by this instance's own vLLM "
                           f"({pids}): vllmwatch is running this deployment")
    if any(h.pid is None for h in found):
        return CheckResult("port", FAIL, f"{where} is in use by a process not visible here; "
                           f"find it with: ss -ltnp 'sport = :{port}' (as root)")
    return CheckResult("port", FAIL, f"{where} is in use by "
                       f"{', '.join(child.describe_pid(h.pid) for h in found)}; stop it or "
                       "change vllm.port")


def _bindable(host: str, port: int, where: str, name: str = "port",
              key: str = "vllm.host") -> CheckResult:
    err = ports.bind_error(host, port)
    if err is None:
        return CheckResult(name, PASS, f"{where} is free")
    if err.errno == errno.EADDRNOTAVAIL:
        return CheckResult(name, FAIL, f"{key} {host!r} is not an address of this "
                           "machine; use 127.0.0.1, 0.0.0.0 or one of its addresses")
    if err.errno == errno.EACCES:
        return CheckResult(name, FAIL, f"binding {where} is not permitted (a port below "
                           "1024 needs CAP_NET_BIND_SERVICE); use a port >= 1024")
    return CheckResult(name, FAIL, f"cannot bind {where}: {err.strerror or err}")


def check_gate_listen(ctx: Context) -> list[CheckResult]:
    """gate.listen can be had (listener); its form and address are the config's to check."""
    c = ctx.config
    try:
        listen = hosts.parse_listen(c.gate.listen) if c.gate.enabled else None
    except ValueError:
        return []  # the config's own check names a bad value
    return [] if listen is None else [listener(ctx, "gate.listen", *listen)]


def listener(ctx: Context, key: str, host: str, port: int) -> CheckResult:
    """One of our own listeners (status.listen, gate.listen) can be had: free, or held by
    this instance's running vllmwatch. Taken by something else, the daemon runs without its
    status endpoint (status.listen_failed) or its gate (gate.failed: every client fails):
    said here, before the start, with who holds it."""
    where = f"[{host}]:{port}" if ":" in host else f"{host or '*'}:{port}"
    found = ports.holders(host, port)
    if not found:
        return _bindable(host, port, where, key, key)
    pids = ", ".join(child.describe_pid(h.pid) for h in found)
    if all(_own_daemon(h.pid, ctx) for h in found):
        return CheckResult(key, PASS, f"{where} is held by this instance's running vllmwatch "
                           f"({pids})")
    if all(_is_daemon(h.pid) for h in found):
        return CheckResult(key, WARN, f"{where} is held by vllmwatch ({pids}): fine if that "
                           f"is this instance, running; else two instances share it: change "
                           f"{key}")
    if any(h.pid is None for h in found):
        return CheckResult(key, FAIL, f"{where} is in use by a process not visible here; find "
                           f"it with: ss -ltnp 'sport = :{port}' (as root)")
    return CheckResult(key, FAIL, f"{where} is in use by {pids}; stop it or change {key}")


def _own_daemon(pid: int | None, ctx: Context) -> bool:
    """The listener is the vllmwatch that holds this config's instance lock."""
    path = groupfile.lock_path(child.instance_id(ctx.config.path), ctx.env or None)
    return pid is not None and path is not None and groupfile.lock_holder(path) == pid \
        and _is_daemon(pid)


def _is_daemon(pid: int | None) -> bool:
    with contextlib.suppress(psutil.Error):
        return pid is not None and kin.is_vllmwatch_daemon(psutil.Process(pid))
    return False


def check_prewarm_cache(ctx: Context) -> CheckResult:
    """prewarm.cache_dir is writable, or can be created."""
    pre = ctx.config.prewarm
    if not pre.enabled:
        return CheckResult("prewarm.cache_dir", SKIP, "prewarm.enabled = false")
    # the directory the daemon uses: systemd's $CACHE_DIRECTORY when set, else cache_dir
    path = Path(cache_root(ctx.config, ctx.env)).expanduser()
    if path.is_dir():
        try:
            with tempfile.TemporaryFile(dir=path):
                pass
        except OSError as exc:
            return CheckResult("prewarm.cache_dir", WARN, f"{path} is not writable "
                               f"({exc.strerror}); caches will be cold after every restart: "
                               "make it writable for the service user (CacheDirectory=)")
        # the daemon's own rule (prewarm.cache_unusable): vLLM loads the caches as code
        shared = [f"{var}: {why}" for var, sub in cache_env(ctx.config, ctx.env).items()
                  if (why := cannot_make(sub, var))]
        if shared:
            return CheckResult("prewarm.cache_dir", WARN, "; ".join(shared) + "; the daemon "
                               "puts vLLM's compiled code in a private folder of its state "
                               "directory instead (cold compiles), HF_HOME at its default: "
                               "chmod o-w,g-w the root")
        return CheckResult("prewarm.cache_dir", PASS, f"{path} is writable")
    parent = next((p for p in path.parents if p.exists()), Path("/"))
    if path.exists() or not os.access(parent, os.W_OK | os.X_OK):
        return CheckResult("prewarm.cache_dir", WARN, f"{path} is not a directory and cannot "
                           f"be created here ({parent} is not writable); create it for the "
                           "service user (systemd CacheDirectory=vllmwatch does)")
    return CheckResult("prewarm.cache_dir", PASS, f"{path} does not exist yet; it can be "
                       "created")
