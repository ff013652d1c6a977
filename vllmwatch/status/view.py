"""The human summary of a /status document, for `vllmwatch status` (status/cli.py fetches
and checks the document; this renders it). Tolerant: a field missing or of the wrong type
counts as absent, so a newer or older daemon's answer still prints.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from vllmwatch.config.convert import printable
from vllmwatch.config.units import format_duration, format_mib
from vllmwatch.core.reuse import one_line
from vllmwatch.status.snapshot import ladder_word

_COLOURS = {"green": "32", "yellow": "33", "red": "31"}
_STATE_COLOUR = {"ready": "green", "failed": "red", **dict.fromkeys(
    ("prewarming", "starting", "draining", "stopping", "backoff"), "yellow")}


_NUMBERS = ("state_for_s", "restart_phase_for_s", "child_pid", "child_uptime_s", "last_restart_at",
            "vllm_running", "vllm_waiting", "vllm_kv_cache_usage", "standby_pid", "standby_rss_mib",
            "canary_unanswered_s", "busy_timeout_s", "next_launch_in_s")
_TABLES = ("restarts_by_reason", "start_phases_s", "probe_last_completed", "probe_failures")
# What a start is doing after its last milestone (shell/childlog.py MILESTONES, in order).
_NEXT_PHASE = {
    "": "launching vLLM (imports)", "load_start": "loading the weights",
    "model_init": "loading the weights", "weights": "finishing the model load",
    "model_loaded": "compiling (torch.compile)", "compile": "profiling memory for the KV cache",
    "kv_cache": "capturing graphs, starting the engine", "graphs_start": "capturing CUDA graphs",
    "graphs": "starting the engine", "engine_init": "starting the API server",
    "server_start": "starting the API server",
    "api_ready": "waiting for a first completion (the canary)",
    "canary": "the first completion answered; going ready",
}


def _num(value: object) -> float | None:
    """A finite number of the answer, or None (an int past a float's range: 10**400 from
    another service overflowed the whole status line)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _table(value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {printable(str(k), False): n for k, v in value.items() if (n := _num(v)) is not None}


_MEMORY_TEXT = ("source", "host_rule_source", "held_rule", "held_detail")  # the rest: numbers


def clean(data: Mapping[str, Any]) -> dict[str, Any]:
    """The document in the shapes render expects: a field of the wrong type counts as absent
    (a newer or older daemon, or a hand-made answer, must not crash the summary)."""
    out: dict[str, Any] = {k: printable(v if isinstance(v, str) else str(v), False)
                           if v is not None and not isinstance(v, bool) else v
                           for k, v in data.items() if k not in _NUMBERS + _TABLES}
    out.update({k: _num(data.get(k)) for k in _NUMBERS})
    out.update({k: _table(data.get(k)) for k in _TABLES})
    reuse = data.get("start_reuse")  # flat: numbers and flags kept, text made printable
    out["start_reuse"] = {printable(str(k), False): v if isinstance(v, (bool, int, float))
                          else printable(str(v), False) for k, v in reuse.items()} \
        if isinstance(reuse, dict) else {}
    if out.get("child_pid") is not None:
        out["child_pid"] = int(out["child_pid"])
    checks = data.get("smoke_checks")  # [[smoke]]: a list of flat tables, text made printable
    out["smoke_checks"] = [{str(k): printable(str(v), False) if isinstance(v, str) else v
                            for k, v in c.items()} for c in checks if isinstance(c, dict)
                           ] if isinstance(checks, list) else []
    for key in ("stale_probes", "restart_required"):  # lists of words
        got = data.get(key)
        out[key] = [printable(str(k), False) for k in got] if isinstance(got, (list, tuple)) else []
    spare = data.get("spare")  # flat, like start_reuse (issue 34)
    out["spare"] = {printable(str(k), False): v if v is None or isinstance(v, (bool, int, float))
                    else printable(str(v), False) for k, v in spare.items()} \
        if isinstance(spare, dict) else None
    out["adapters"] = _adapters_clean(data.get("adapters"))
    mem = data.get("memory")
    mem = mem if isinstance(mem, dict) else {}
    out["memory"] = {k: (_table(v) if isinstance(v, dict) else _num(v)) for k, v in mem.items()
                     if k not in _MEMORY_TEXT}
    out["memory"] = {k: v for k, v in out["memory"].items() if v is not None}
    out["memory"].update({k: printable(v, False) for k in _MEMORY_TEXT
                          if isinstance(v := mem.get(k), str)})
    out["memory"]["source"] = printable(str(mem.get("source", "none")), False)
    for key in ("gpu_tree_by_gpu_mib", "device_used_mib", "device_total_mib"):
        table = out["memory"].get(key)
        out["memory"][key] = {g: v for g, v in (table or {}).items() if g.isdigit()}
    return out


def render(data: Mapping[str, Any], colour: bool = False, now: float | None = None) -> str:
    """The human summary of a /status document; tolerant of missing and odd fields."""
    now = time.time() if now is None else now
    data = clean(data)
    state = str(data.get("state", "?"))
    shown = _paint(state, _STATE_COLOUR.get(state), colour)
    for_s = data.get("state_for_s")
    rows = [("state", shown + (f" for {format_duration(for_s)}" if for_s is not None else "")
             + (" (draining)" if data.get("draining") else "")),
            # `true` only: a foreign service's "ready": "no" (a non-empty string) is not a yes
            ("ready", "yes" if data.get("ready") is True and data.get("draining") is not True
             else "no")]
    phase = data.get("restart_phase")
    if phase and phase != "idle":  # a daemon older than the ladder's phases sends none
        took = data.get("restart_phase_for_s")  # (one without restart_reason: "restart")
        word = ladder_word(str(phase), data.get("restart_reason", "?"), data.get("exit_reason"))
        left = data.get("next_launch_in_s")  # a backoff: when it tries again (up to 5 min)
        rows.append((word.split()[-1], str(phase) + (f" for {format_duration(took)}"
                                                     if took is not None else "")
                     + (f", next launch in {format_duration(left)}" if left is not None else "")))
    why = data.get("exit_reason")
    if why and why != "stop":  # leaving for a cause (statusline.summary says it the same way)
        rows.append(("exiting", f"{data.get('exit_code')}: {why}"
                     + (f" ({data['exit_detail']})" if data.get("exit_detail") else "")))
    pid, uptime = data.get("child_pid"), data.get("child_uptime_s")
    launch = data.get("launch")
    rows.append(("child", "none" if pid is None else f"pid {pid}"
                 + (f", up {format_duration(uptime)}" if uptime is not None else "")
                 + (f" ({launch} launch)" if launch else "")))
    url, model = (v if isinstance(v := data.get(k), str) else "" for k in ("serving_url", "model"))
    if url or model:
        rows.append(("serving", " ".join(filter(None, (url, model and f"model {model}")))))
    rows += _standby_rows(data)
    rows += _spare_rows(data)
    rows += _adapter_rows(data.get("adapters"))
    rows += _restart_rows(data, now)
    rows += _start_rows(data, state)
    rows += _smoke_rows(data["smoke_checks"])
    rows += _probe_rows(data, now)
    rows += _memory_rows(data.get("memory") or {})
    rows.append(("vLLM", _vllm_line(data)))
    sha = str(data.get("config_sha256") or "")
    rows.append(("config", f"{data.get('config_path') or '?'}"
                 + (f" (sha256 {sha[:12]})" if sha else "")))
    refused, keys = data.get("reload_refused"), data["restart_required"]  # (as STATUS= says)
    rows += [("reload", f"refused, the running config kept: {refused}")] * bool(refused) + [
        ("pending", "restart vllmwatch to apply " + ", ".join(keys))] * bool(keys)
    rows.append(("versions", f"vllmwatch {data.get('vllmwatch_version', '?')}, "
                 f"vLLM {data.get('vllm_version') or '?'}"))
    width = max(len(label) for label, _ in rows) + 2
    return "\n".join(f"{label:<{width}}{value}" for label, value in rows)


def _standby_rows(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The pre-imported interpreter for the next launch: what it is doing and what it holds,
    or why there is none (a daemon older than the standby sends no such fields: no row)."""
    state = data.get("standby_state")
    if not state:
        return []
    line = str(state)
    if data.get("standby_pid") is not None:
        line += f", pid {int(data['standby_pid'])}"
    if data.get("standby_rss_mib") is not None:
        line += f", rss {format_mib(data['standby_rss_mib'])}"
    if state == "off" and data.get("standby_reason"):  # else the last discard's: stale
        line += f": {data['standby_reason']}"
    return [("standby", line)]


def _spare_rows(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Who serves and the sleeping spare engine (issue 34); no rows when it is not planned."""
    spare = data.get("spare")
    if not isinstance(spare, Mapping):
        return []
    took = spare.get("for_s")  # serving: how long clients have had the smaller engine
    line = str(spare.get("state")) + (f" for {format_duration(took)}" if isinstance(
        took, (int, float)) and spare.get("state") != "off" else "") + (
        f", pid {spare['pid']}" if isinstance(spare.get("pid"), int) else "")
    if isinstance(spare.get("build"), int) and spare["build"]:  # pairs with spare.* events
        line += f", build {spare['build']}"
    if (mib := _num(spare.get("memory_mib"))) is not None:
        line += f", gpu {format_mib(mib)}"
    if isinstance(spare.get("failovers"), int) and spare["failovers"]:
        line += f", {spare['failovers']} failovers"
        took = spare.get("last_failover_s")
        if isinstance(took, (int, float)):
            line += f" (last served {took:.2f}s after restart.begin)"
    if spare.get("state") in ("off", "down") and spare.get("why"):
        line += f": {spare['why']}"
    who = str(data.get("serving") or "nobody")  # (the restart row: where the full one is)
    return [("answering", who + (" (degraded: spare serving, the full engine relaunching)"
                                 if who == "spare" else "")), ("spare", line)]


def _adapters_clean(data: object) -> dict[str, Any] | None:
    """[[adapters]]' part of /status with every text made printable (vLLM's errors)."""
    if not isinstance(data, dict):
        return None
    rows = data.get("managed")
    names = data.get("unmanaged")
    return {"managed": [{str(k): printable(v, False) if isinstance(v, str) else v
                         for k, v in r.items()} for r in rows if isinstance(r, dict)]
            if isinstance(rows, list) else [],
            "unmanaged": [printable(str(n), False) for n in names]
            if isinstance(names, list) else []}


def _adapter_rows(data: object) -> list[tuple[str, str]]:
    """[[adapters]]: each one's state (vLLM's error when it refused it), and the adapters
    loaded by hand, which no restart brings back."""
    if not isinstance(data, dict):
        return []
    rows = []
    for row in data.get("managed", []):
        line = f"{row.get('state')}" + ("" if row.get("required") else " (not required)")
        if row.get("error"):
            line += f": {row['error']}"
        rows.append((f"adapter {row.get('name')}", line))
    return rows + [(f"adapter {name}", "unmanaged: loaded by hand, lost at the next restart "
                    "(add it to [[adapters]] to keep it)") for name in data.get("unmanaged", [])]


def _restart_rows(data: Mapping[str, Any], now: float) -> list[tuple[str, str]]:
    by_reason: Mapping[str, float] = data["restarts_by_reason"]
    total = sum(by_reason.values())
    detail = ", ".join(f"{k} {v:.0f}" for k, v in sorted(by_reason.items()))
    rows = [("restarts", f"{total:.0f}" + (f" ({detail})" if detail else ""))]
    reason = data.get("last_reason")
    if reason:
        line = str(reason) + (f": {said}" if (said := data.get("last_reason_detail")) else "")
        if at := data.get("last_restart_at"):
            line += f" ({format_duration(max(0.0, now - at))} ago)"
        rows.append(("last", line))
    if data.get("last_incident"):
        rows.append(("incident", f"{data['last_incident']} (vllmwatch incidents show "
                     f"{data['last_incident']})"))
    return rows


def _start_rows(data: Mapping[str, Any], state: str) -> list[tuple[str, str]]:
    """Where each start phase ended, as offsets since the launch ("weights at +1m34s", not
    durations), and while starting, the phase it is in now."""
    phases: Mapping[str, float] = data["start_phases_s"]
    rows = []
    if state in ("starting", "prewarming"):
        last = max(phases, key=lambda k: phases[k], default="")
        now_doing = _NEXT_PHASE.get(last, f"after {last}")
        since = f" (since +{format_duration(phases[last])})" if last else ""
        rows.append(("phase", (now_doing + since) if state == "starting" else "pre-warming"))
    if phases:
        rows.append(("startup", ", ".join(f"{k} at +{format_duration(v)}"
                                          for k, v in phases.items())))
    reused = data.get("start_reuse")
    if isinstance(reused, Mapping) and reused:  # issue 33: what the launch reused
        hit = reused.get("compile_cache_hit")
        rows.append(("reused", one_line(reused, hit if isinstance(hit, bool) else None,
                                        data.get("start_phases_s"))))
    return rows


def _smoke_rows(checks: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """This start's [[smoke]] checks: a summary, then one row per failed check with vLLM's
    error (a required one holds READY; an optional one is only reported)."""
    if not checks:
        return []
    counts: dict[str, int] = {}
    for c in checks:
        counts[str(c.get("result"))] = counts.get(str(c.get("result")), 0) + 1
    rows = [("smoke", ", ".join(f"{n} {r}" for r, n in counts.items()))]
    for c in checks:
        if c.get("result") == "failed":
            held = "holds READY" if c.get("required") else "optional, not holding READY"
            rows.append(("  failed", f"{c.get('name')} ({c.get('endpoint')}, {held}): "
                         f"{c.get('error')}"))
    return rows


def _probe_rows(data: Mapping[str, Any], now: float) -> list[tuple[str, str]]:
    """Probe health: when each kind last completed (ok or not), the failures so far, and any
    kind with no result within its bound (what the watchdog acts on)."""
    done: Mapping[str, float] = data["probe_last_completed"]
    failed: Mapping[str, float] = data["probe_failures"]
    stale = data["stale_probes"]
    if not done and not failed and not stale:
        return []
    parts = [f"{k} {format_duration(max(0.0, now - t))} ago" for k, t in sorted(done.items())]
    line = ("last done " + ", ".join(parts)) if parts else "none done yet"
    fails = ", ".join(f"{k} {v:.0f}" for k, v in sorted(failed.items()) if v)
    if fails:
        line += f"; failed: {fails}"
    if stale:
        line += f"; STALE (no result in time): {', '.join(stale)}"
    rows = [("probes", line)]
    if (unanswered := data.get("canary_unanswered_s")) is not None:  # "ready yes" alone
        limit = data.get("busy_timeout_s")  # hid an API server that answers nobody (37.8)
        rows.append(("canary", f"UNANSWERED for {format_duration(unanswered)}: excused while "
                     "vLLM's counters move; a hang restart at probe.busy_timeout"
                     + (f" {format_duration(limit)}" if limit is not None else "")))
    return rows


def _memory_rows(mem: Mapping[str, Any]) -> list[tuple[str, str]]:
    rows = [("memory", f"source {mem.get('source', 'none')}")]
    tree, used = mem["gpu_tree_by_gpu_mib"], mem["device_used_mib"]
    total = mem["device_total_mib"]
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
    if mem.get("held_rule") is not None:
        rows.append(("  held", f"{mem['held_rule']} holds; the restart waits for "
                     f"restart.quiet_hours ({format_duration(mem.get('held_for_s') or 0.0)} "
                     f"so far): {mem.get('held_detail') or ''}"))
    return rows


def _vllm_line(data: Mapping[str, Any]) -> str:
    running, waiting = data.get("vllm_running"), data.get("vllm_waiting")
    kv = data.get("vllm_kv_cache_usage")
    if running is None and waiting is None and kv is None:
        return "no scrape yet"
    count = ["?" if v is None else f"{v:.0f}" for v in (running, waiting)]
    return (f"running {count[0]}, waiting {count[1]}, KV cache "
            + ("?" if kv is None else f"{kv * 100:.0f}%"))


def _rate(mib_per_h: float) -> str:
    return ("+" if mib_per_h >= 0 else "-") + format_mib(abs(mib_per_h)) + "/h"


def _paint(text: str, colour: str | None, enabled: bool) -> str:
    if not enabled or colour is None:
        return text
    return f"\033[{_COLOURS[colour]}m{text}\033[0m"
