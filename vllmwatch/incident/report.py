"""An incident record as a page a person reads in a minute.

Sections, in order: reason and timeline; what each vLLM thread was doing (innermost vLLM
frames first); the metrics that moved; memory and GPU; the last output lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

OUTPUT_SHOWN = 40  # last output lines in the report (all of them are in output.log)
VLLM_FRAMES = 6  # vLLM frames shown per thread
_KEY_SERIES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
               "vllm:kv_cache_usage_perc", "vllm:generation_tokens_total",
               "vllm:prompt_tokens_total", "vllm:num_preemptions_total")


def render(r: Mapping[str, Any]) -> str:
    """The whole report."""
    parts = [_head(r), _threads(r), _metrics(r), _memory(r), _output(r)]
    return "\n\n".join(p for p in parts if p) + "\n"


def _head(r: Mapping[str, Any]) -> str:
    lines = [f"incident {r.get('id')}  {r.get('time_utc')}",
             f"reason: {r.get('reason')}: {r.get('detail')}"]
    if r.get("exit_code") is not None:
        lines.append(f"vllmwatch exited with code {r['exit_code']} after this")
    tree = r.get("tree") or {}
    lines.append(f"tree: {tree.get('note', '?')}")
    v = r.get("versions") or {}
    lines.append("versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val))
    lines.append(f"config sha256 {str(r.get('config_sha256', ''))[:12]}; record took "
                 f"{(r.get('capture') or {}).get('seconds', '?')} s")
    lines.append("timeline (s before the incident):")
    lines += [f"  {t:>10.1f}  {what}" for t, what in r.get("timeline") or []]
    return "== reason and timeline ==\n" + "\n".join(lines)


def is_vllm(frame: Sequence[Any]) -> bool:
    """A frame in vLLM's own code (py-spy shows short paths, faulthandler full ones)."""
    path = str(frame[1])
    return "vllm/" in path and "vllmwatch" not in path


def _threads(r: Mapping[str, Any]) -> str:
    stacks = r.get("stacks") or {}
    lines = ["methods: " + "; ".join(f"{k} {v}" for k, v in
                                     (stacks.get("methods") or {}).items())]
    for proc in stacks.get("processes") or []:
        dumps = [d for d in proc.get("dumps", []) if d.get("ok")]
        head = f"{proc.get('role')} pid {proc.get('pid')}"
        if not dumps:
            why = "; ".join(f"{d['method']}: {d['error']}" for d in proc.get("dumps", []))
            lines.append(f"{head}: no stacks ({why or 'no method ran'})")
            continue
        best = dumps[0]  # py-spy first when it ran: it names threads
        lines.append(f"{head} ({best['method']}, {len(best['threads'])} threads):")
        for t in best["threads"]:
            lines += _thread(t)
    return "== what each vLLM thread was doing ==\n" + "\n".join(lines)


def _thread(t: Mapping[str, Any]) -> list[str]:
    frames = t.get("frames") or []
    if not frames:
        return [f"  thread {t.get('name')}: (no Python frames)"]
    inner = frames[0]
    out = [f"  thread {t.get('name')}: in {inner[0]} ({_where(inner)})"]
    ours = [f for f in frames if is_vllm(f)][:VLLM_FRAMES]
    out += [f"      vllm: {f[0]} ({_where(f)})" for f in ours]
    return out


def _where(f: Sequence[Any]) -> str:
    return f"{f[1]}:{f[2]}" if f[2] is not None else str(f[1])


def _metrics(r: Mapping[str, Any]) -> str:
    m = r.get("metrics") or {}
    if not m.get("last"):
        return "== metrics that moved ==\n" + str(m.get("note", "no scrape"))
    lines = [f"last /metrics scrape {m.get('last_age_s')} s before the incident"]
    if "moved" in m:
        lines.append(f"moved over the {m.get('since_s')} s before it:")
        lines += [f"  {name}: {_num(old)} -> {_num(new)}" for name, old, new in m["moved"][:30]]
        if not m["moved"]:
            lines.append("  nothing moved (a hung engine freezes its counters and gauges)")
        still = [n for n in m.get("unchanged", []) if n.split("{")[0] in _KEY_SERIES]
        if still:
            lines.append("unchanged: " + ", ".join(s.split("{")[0] for s in still))
    for name, value in m["last"].items():
        if name.split("{")[0] in _KEY_SERIES:
            lines.append(f"  {name} = {_num(value)}")
    return "== metrics that moved ==\n" + "\n".join(lines)


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def _memory(r: Mapping[str, Any]) -> str:
    mem = r.get("memory") or {}
    tree = r.get("tree") or {}
    lines = [f"host RSS of the tree: {tree.get('host_rss_mib')} MiB"]
    lines += [f"  {p['role']} pid {p['pid']} state {p['state']}: {p['rss_mib']} MiB RSS, "
              f"{p['threads']} threads" for p in tree.get("processes", [])]
    last = mem.get("last_sample") or {}
    if last:
        lines.append(f"last sample: source {last.get('source')}, GPU tree "
                     f"{last.get('gpu_tree_mib')} MiB, device used "
                     f"{last.get('device_used_mib')} MiB, host RSS {last.get('host_rss_mib')}"
                     f", PSS {last.get('host_pss_mib')} MiB, faults {last.get('gpu_faults')}")
    gpu = mem.get("gpu_now") or {}
    if gpu:
        lines.append(f"NVML now: {gpu}")
    samples = mem.get("samples") or {}
    recent = samples.get("recent") or []
    if recent:
        lines.append(f"samples the memory rules judged (newest last; sustain "
                     f"{samples.get('sustain')}):")
        lines += [f"  -{s['s_ago']:.0f}s  GPU {_num(s['gpu_rule_mib'])} MiB  host "
                  f"{_num(s['host_rule_mib'])} MiB" for s in recent[-12:]]
    return "== memory and GPU ==\n" + "\n".join(lines)


def _output(r: Mapping[str, Any]) -> str:
    out = r.get("output") or []
    shown = out[-OUTPUT_SHOWN:]
    head = f"== last output lines ({len(shown)} of {len(out)}; all in output.log) =="
    return head + "\n" + "\n".join(shown)
