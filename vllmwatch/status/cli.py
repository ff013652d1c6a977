"""`vllmwatch status`: ask the running daemon's /status and print a summary (or the raw JSON)."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any, TextIO
from urllib.parse import urlsplit

from vllmwatch.config.schema import ConfigError, config_path, load
from vllmwatch.config.units import format_duration, format_mib
from vllmwatch.status.server import parse_listen

DEFAULT_URL = "http://127.0.0.1:9101"
TIMEOUT_S = 3.0
EXIT_OK, EXIT_ERROR, EXIT_NOT_RUNNING = 0, 1, 3  # 3 as in `systemctl status`: not running

_COLOURS = {"green": "32", "yellow": "33", "red": "31"}
_STATE_COLOUR = {"ready": "green", "failed": "red"}
for _state in ("prewarming", "starting", "draining", "stopping", "backoff"):
    _STATE_COLOUR[_state] = "yellow"


def main(config_arg: str | None, url: str | None, as_json: bool) -> int:
    """Fetch /status and print it; 3 when the daemon does not answer, 1 on other errors."""
    try:
        base = url or url_from_config(config_arg)
    except ValueError as exc:
        print(f"vllmwatch status: {exc}", file=sys.stderr)
        return EXIT_ERROR
    target = status_url(base)
    try:
        body = fetch(target)
    except ConnectionRefusedError:
        print(f"vllmwatch is not running (no answer at {target}); start it with "
              "`systemctl start vllmwatch`", file=sys.stderr)
        return EXIT_NOT_RUNNING
    except (OSError, ValueError) as exc:
        print(f"vllmwatch status: cannot read {target}: {_reason(exc)}", file=sys.stderr)
        return EXIT_ERROR
    if as_json:
        sys.stdout.write(body if body.endswith("\n") else body + "\n")
        return EXIT_OK
    try:
        data = json.loads(body)
    except ValueError as exc:
        print(f"vllmwatch status: {target} did not return JSON: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(render(data, colour=use_colour(sys.stdout)))
    return EXIT_OK


def url_from_config(config_arg: str | None) -> str:
    """The base URL from the config's status.listen; the default when the config won't load."""
    try:
        config = load(config_path(config_arg))
    except ConfigError:
        return DEFAULT_URL
    parsed = parse_listen(config.status.listen)
    if parsed is None:
        raise ValueError(f'{config.path}: status.listen = "" disables the status listener; '
                         "set it (e.g. \"127.0.0.1:9101\") or pass --url")
    host, port = parsed
    # A wildcard bind answers on loopback too.
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def status_url(base: str) -> str:
    """Accept a bare base URL ("http://host:port") or the full /status URL."""
    if "://" not in base:
        base = "http://" + base
    return base.rstrip("/") + "/status" if urlsplit(base).path in ("", "/") else base


def fetch(url: str) -> str:
    """GET url with a short timeout; proxies are bypassed (the daemon is local)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=TIMEOUT_S) as response:
            return str(response.read().decode("utf-8"))
    except urllib.error.HTTPError:
        raise
    except urllib.error.URLError as exc:
        # Unwrap so that callers can tell "refused" (not running) from the rest.
        if isinstance(exc.reason, OSError):
            raise exc.reason from None
        raise


def use_colour(stream: TextIO) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (no-color.org)."""
    return stream.isatty() and "NO_COLOR" not in os.environ


def render(data: Mapping[str, Any], colour: bool = False, now: float | None = None) -> str:
    """The human summary of a /status document; tolerant of missing fields."""
    now = time.time() if now is None else now
    state = str(data.get("state", "?"))
    shown = _paint(state, _STATE_COLOUR.get(state), colour)
    for_s = data.get("state_for_s")
    rows = [("state", shown + (f" for {format_duration(for_s)}" if for_s is not None else "")
             + (" (draining)" if data.get("draining") else "")),
            ("ready", "yes" if data.get("ready") and not data.get("draining") else "no")]
    pid, uptime = data.get("child_pid"), data.get("child_uptime_s")
    rows.append(("child", "none" if pid is None else f"pid {pid}"
                 + (f", up {format_duration(uptime)}" if uptime is not None else "")))
    rows += _restart_rows(data, now)
    phases = data.get("start_phases_s") or {}
    if phases:
        rows.append(("startup", ", ".join(f"{k} {format_duration(v)}" for k, v in phases.items())))
    rows += _memory_rows(data.get("memory") or {})
    rows.append(("vLLM", _vllm_line(data)))
    sha = str(data.get("config_sha256") or "")
    rows.append(("config", f"{data.get('config_path') or '?'}"
                 + (f" (sha256 {sha[:12]})" if sha else "")))
    rows.append(("versions", f"vllmwatch {data.get('vllmwatch_version', '?')}, "
                 f"vLLM {data.get('vllm_version') or '?'}"))
    width = max(len(label) for label, _ in rows) + 2
    return "\n".join(f"{label:<{width}}{value}" for label, value in rows)


def _restart_rows(data: Mapping[str, Any], now: float) -> list[tuple[str, str]]:
    by_reason: Mapping[str, int] = data.get("restarts_by_reason") or {}
    total = sum(by_reason.values())
    detail = ", ".join(f"{k} {v}" for k, v in sorted(by_reason.items()))
    rows = [("restarts", f"{total}" + (f" ({detail})" if detail else ""))]
    reason = data.get("last_reason")
    if reason:
        line = str(reason)
        if data.get("last_reason_detail"):
            line += f": {data['last_reason_detail']}"
        at = data.get("last_restart_at")
        if at:
            line += f" ({format_duration(max(0.0, now - at))} ago)"
        rows.append(("last", line))
    return rows


def _memory_rows(mem: Mapping[str, Any]) -> list[tuple[str, str]]:
    rows = [("memory", f"source {mem.get('source', 'none')}")]
    tree = mem.get("gpu_tree_by_gpu_mib") or {}
    used, total = mem.get("device_used_mib") or {}, mem.get("device_total_mib") or {}
    for gpu in sorted(set(tree) | set(used) | set(total), key=lambda g: int(g)):
        parts = []
        if gpu in tree:
            parts.append(f"tree {format_mib(tree[gpu])}")
        if gpu in used:
            parts.append(f"device {format_mib(used[gpu])}"
                         + (f" / {format_mib(total[gpu])}" if gpu in total else ""))
        rows.append((f"  gpu {gpu}", ", ".join(parts)))
    if mem.get("gpu_tree_mib") is not None and len(tree) != 1:
        rows.append(("  gpu tree", format_mib(mem["gpu_tree_mib"])))
    host = [f"{k} {format_mib(mem[f'host_{k}_mib'])}" for k in ("rss", "pss")
            if mem.get(f"host_{k}_mib") is not None]
    if host:
        rows.append(("  host", ", ".join(host)))
    for label, suffix, fmt in (("  baseline", "baseline_mib", format_mib),
                               ("  slope", "slope_mib_per_h", _rate)):
        parts = [f"{kind} {fmt(mem[f'{kind}_{suffix}'])}" for kind in ("gpu", "host")
                 if mem.get(f"{kind}_{suffix}") is not None]
        if parts:
            rows.append((label, ", ".join(parts)))
    return rows


def _vllm_line(data: Mapping[str, Any]) -> str:
    running, waiting = data.get("vllm_running"), data.get("vllm_waiting")
    kv = data.get("vllm_kv_cache_usage")
    if running is None and waiting is None and kv is None:
        return "no scrape yet"
    return ", ".join([f"running {_count(running)}", f"waiting {_count(waiting)}",
                      "KV cache " + ("?" if kv is None else f"{kv * 100:.0f}%")])


def _count(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"


def _rate(mib_per_h: float) -> str:
    return ("+" if mib_per_h >= 0 else "-") + format_mib(abs(mib_per_h)) + "/h"


def _paint(text: str, colour: str | None, enabled: bool) -> str:
    if not enabled or colour is None:
        return text
    return f"\033[{_COLOURS[colour]}m{text}\033[0m"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, TimeoutError):
        return f"no answer within {TIMEOUT_S:.0f}s"
    return str(exc)
