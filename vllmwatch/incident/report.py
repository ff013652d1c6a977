"""An incident record as a page a person reads in a minute.

Sections, in order: reason, cause and timeline; what each vLLM thread was doing (innermost
vLLM frames first); the metrics (a summary, then every series that moved); memory and GPU;
the output (the first error block of the window, then the last lines). The first five lines
name the cause (issue 36): the reason and its detail, then the record's cause lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllmwatch.config.convert import printable
from vllmwatch.config.units import format_duration
from vllmwatch.core import exitcodes
from vllmwatch.core.reuse import one_line
from vllmwatch.incident.cause import first_error, telling

OUTPUT_SHOWN = 40  # last output lines in the report (all of them are in output.log)
ERROR_BLOCK = 30  # lines of the first ERROR/Traceback block shown above them
VLLM_FRAMES = 6  # vLLM frames shown per thread
_KEY_SERIES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
               "vllm:kv_cache_usage_perc", "vllm:generation_tokens_total",
               "vllm:prompt_tokens_total", "vllm:num_preemptions_total")


# What a field of the wrong shape raises while a section is written (a damaged or hostile
# record: a string for a number, an integer of 400 digits for a float).
SHAPE_ERRORS = (AttributeError, TypeError, KeyError, IndexError, ValueError, ArithmeticError,
                RecursionError)


def render(r: Mapping[str, Any]) -> str:
    """The whole report; a section with a field of an unexpected shape says so in its place,
    and the others are shown (one bad field no longer costs the whole page)."""
    parts = []
    for title, section in (("reason and timeline", _head), ("threads", _threads),
                           ("metrics", _metrics), ("memory and GPU", _memory),
                           ("output", _output)):
        try:
            parts.append(section(r))
        except SHAPE_ERRORS as exc:
            # why it happened is never lost: the reason lines are plain text of any shape
            first = "\n".join(_reason(r) + _cause(r)) + "\n" if section is _head else ""
            parts.append(f"== {title} ==\n{first}(not shown: a field has an unexpected "
                         f"shape, {type(exc).__name__}: {exc}; `vllmwatch incidents show "
                         f"{r.get('id')} --json` prints the record as it is)")
    # vLLM's lines, thread names and paths are outside text: no raw control character
    # reaches the terminal (an ANSI colour code shows as \x1b[...).
    return printable("\n\n".join(p for p in parts if p)) + "\n"


def _reason(r: Mapping[str, Any]) -> list[str]:
    # one line each, whatever a record holds: a newline in a field added lines to the report
    one = {k: printable(str(r.get(k) or ""), False) for k in ("id", "time_utc", "reason",
                                                            "detail")}
    return [f"incident {one['id']}  {one['time_utc'] or 'time unknown'}",
            f"reason: {one['reason'] or '?'}: {one['detail']}"]


def _cause(r: Mapping[str, Any]) -> list[str]:
    """The cause lines, whatever the rest of the head holds (a bad field elsewhere in it
    dropped them with it)."""
    cause = r.get("cause")  # (one line each too: the head's first lines name the cause)
    return [f"cause: {printable(str(c), False)}" for c in cause] if isinstance(cause, list) \
        else [f"cause: {printable(str(cause), False)}"] if cause else []


def _head(r: Mapping[str, Any]) -> str:
    lines = _reason(r) + _cause(r)
    out = (r.get("core") or {}).get("outage")  # a relaunch that failed: not a lone restart
    if isinstance(out, Mapping) and isinstance(ago := out.get("began_s_ago"), int | float):
        lines.append(f"outage: restart {out.get('restarts')} since the {out.get('began_with')} "
                     f"restart {format_duration(max(0.0, ago))} before; no launch since served")
    code = r.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        lines.append(f"vllmwatch exited with code {code} after this: "
                     f"{exitcodes.MEANING.get(code, 'a code this version does not know')}")
        oom = r.get("oom")  # its cgroup names the unit the commands are for
        cgroup = oom.get("cgroup") if isinstance(oom, Mapping) else None
        unit = exitcodes.unit_of(cgroup) or (exitcodes.NO_SERVICE if isinstance(cgroup, str)
                                             else None)  # read, not a service: none of systemd
        lines.append(f"next: {exitcodes.after_exit(code, unit)}")
    elif code is not None:
        lines.append(f"vllmwatch exited with code {code!r} after this")
    gate = r.get("gate")
    if isinstance(gate, Mapping):
        lines.append("gate: " + gate_line(gate))
    tree = r.get("tree") or {}
    lines.append(f"tree: {tree.get('note', '?')}")
    v = r.get("versions") or {}
    lines.append("versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val))
    core = r.get("core") or {}
    if isinstance(core.get("start_reuse"), Mapping):  # issue 33: vLLM's start-up caches
        hit = core.get("compile_cache_hit")
        lines.append("last launch reused: " + one_line(
            core["start_reuse"], hit if isinstance(hit, bool) else None,
            core.get("start_phases_s")))
    lines.append(f"config sha256 {str(r.get('config_sha256', ''))[:12]}; record took "
                 f"{(r.get('capture') or {}).get('seconds', '?')} s")
    lines.append("timeline (s before the incident):")
    for entry in r.get("timeline") or []:  # one odd entry costs its line, not the page
        t, what = entry if isinstance(entry, list | tuple) and len(entry) == 2 else (None, entry)
        lines.append(f"  {_before(t)}  {what}" if isinstance(t, int | float) and
                     not isinstance(t, bool) else f"  {'?':>10}  {what}")
    return "== reason and timeline ==\n" + "\n".join(lines)


def gate_line(g: Mapping[str, Any]) -> str:
    """The gate's figures of the engine that went: "N requests in flight: M replayed, K cut",
    then what else became of them when anything did (issue 35)."""
    line = (f"{g.get('in_flight', 0)} requests in flight: {g.get('replayed', 0)} replayed, "
            f"{g.get('cut', 0)} cut")
    rest = [f"{g[k]} {what}" for k, what in (
        ("not_replayed", "not replayed (answered 502 or 504, or vLLM's own aborted answer "
                         "passed on)"), ("answered", "answered"),
        ("open", "still open when recorded")) if g.get(k)]
    return line + ("; " + ", ".join(rest) if rest else "")


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
        read = [d for d in dumps if d["threads"]]  # a dumper can attach and read none
        if not read:  # (a process on its way out)
            lines.append(f"{head} ({', '.join(d['method'] for d in dumps)}: no Python "
                         "thread read)")
            continue
        best = read[0]  # py-spy first when it ran: it names threads
        state = next((p.get("state") for p in (r.get("tree") or {}).get("processes") or []
                      if p.get("pid") == proc.get("pid")), None)
        if state in ("T", "t"):  # py-spy calls every thread of a stopped process idle
            head += " (stopped: every thread is frozen where it was)"
        lines.append(f"{head} ({best['method']}, {len(best['threads'])} threads):")
        for t in best["threads"]:
            lines += _thread(t)
    return "== what each vLLM thread was doing ==\n" + "\n".join(lines)


def _thread(t: Mapping[str, Any]) -> list[str]:
    frames = t.get("frames") or []
    if not frames:
        return [f"  thread {t.get('name')}: (no Python frames)"]
    inner = frames[0]
    name = str(t.get("name"))
    if t.get("blocked"):  # not idle: waiting to take a lock (dumpers.mark_blocked)
        name = name.replace(" (idle)", "") + " (blocked on a lock)"
    out = [f"  thread {name}: in {inner[0]} ({_where(inner)})"]
    ours = [f for f in frames if is_vllm(f)][:VLLM_FRAMES]
    out += [f"      vllm: {f[0]} ({_where(f)})" for f in ours]
    return out


def _where(f: Sequence[Any]) -> str:
    return f"{f[1]}:{f[2]}" if f[2] is not None else str(f[1])


def _metrics(r: Mapping[str, Any]) -> str:
    m = r.get("metrics") or {}
    if not m.get("last"):
        return "== metrics that moved ==\n" + str(m.get("note", "no scrape"))
    lines = [f"last /metrics scrape {m.get('last_age_s')} s before the incident", *_summary(m)]
    if "moved" in m:
        lines.append(f"every series that moved over the {m.get('since_s')} s before it:")
        lines += [f"  {name}: {_num(old)} -> {_num(new)}" for name, old, new in m["moved"]]
        if not m["moved"]:
            lines.append("  nothing moved (a hung engine freezes its counters and gauges)")
        still = [n for n in m.get("unchanged", []) if n.split("{")[0] in _KEY_SERIES]
        if still:
            lines.append("unchanged: " + ", ".join(s.split("{")[0] for s in still))
    for name, value in m["last"].items():
        if name.split("{")[0] in _KEY_SERIES:
            lines.append(f"  {name} = {_num(value)}")
    return "== metrics that moved ==\n" + "\n".join(lines)


def _summary(m: Mapping[str, Any]) -> list[str]:
    """Issue 36.18: what a person asks first, before the full list."""
    s = m.get("summary") or {}
    if not s:
        return []
    kv = s.get("kv_cache_usage")
    out = [f"summary: {_num(s.get('running'))} running, {_num(s.get('waiting'))} waiting, "
           f"KV cache {'-' if kv is None else f'{kv * 100:.0f}%'} used"]
    moved = s.get("tokens_last_moved_s_ago")
    window = s.get("window_s")
    out.append("  generation tokens last moved " + (
        f"between {moved[0]:g} and {moved[1]:g} s before the incident" if moved
        else f"not at all in the {window:g} s kept" if window else "(one scrape: unknown)"))
    rates = [f"{_num(s[k])} {what}/s" for k, what in (
        ("generation_tokens_per_s", "generation tokens"), ("prompt_tokens_per_s",
                                                            "prompt tokens"),
        ("requests_finished_per_s", "requests finished")) if s.get(k) is not None]
    if rates:
        out.append(f"  over the {window:g} s kept: " + ", ".join(rates))
    return out


def _num(v: Any) -> str:
    """A figure as it was counted: a counter whole (`123456789`, which `:g` made 1.23457e+08
    on both sides of a move that changed it), a gauge to 6 significant digits."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e18:
        return str(int(v))
    return "-" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def _memory(r: Mapping[str, Any]) -> str:
    mem = r.get("memory") or {}
    tree = r.get("tree") or {}
    # a tree already gone measured nothing: its sum of no process read as a 0 MiB vLLM
    gone = tree.get("alive") is False and not tree.get("processes")
    lines = ["host RSS of the tree: " + ("- (no process of it was left)" if gone
                                          else _mib(tree.get("host_rss_mib")))]
    lines += [f"  {p['role']} pid {p['pid']} state {p['state']}: {_mib(p['rss_mib'])} RSS, "
              f"{p['threads']} threads" for p in tree.get("processes", [])]
    last = mem.get("last_sample") or {}
    if last:
        lines.append(_last_sample(last))
    gpu = mem.get("gpu_now") or {}
    if gpu:
        lines.append(_nvml_now(gpu))
    samples = mem.get("samples") or {}
    recent = samples.get("recent") or []
    if recent:
        lines.append(f"samples the memory rules judged (s before the incident, newest last; "
                     f"sustain {samples.get('sustain')}):")
        # in the timeline's tenths and the record's MiB: two samples 0.5 s apart both read
        # "-1s", the newest "-0s", and a PSS "host 27.3037 MiB"
        lines += [f"  {_before(-s['s_ago'])}  GPU {_mib(s['gpu_rule_mib'], '-')}  host "
                  f"{_mib(s['host_rule_mib'], '-')}" for s in recent[-12:]]
    return "== memory and GPU ==\n" + "\n".join(lines)


def _last_sample(last: Mapping[str, Any]) -> str:
    """The last memory sample in words; a figure that was not measured is left out."""
    parts = []
    if last.get("gpu_tree_mib") is not None:
        parts.append(f"GPU tree {_mib(last['gpu_tree_mib'])}"
                     + _per_gpu(last.get("gpu_tree_by_gpu_mib"), None))
    used = last.get("device_used_mib") or {}
    if used:
        parts.append("device used" + _per_gpu(used, last.get("device_total_mib") or {}))
    parts.append(f"host RSS {_mib(last.get('host_rss_mib'))}")
    if last.get("host_pss_mib") is not None:
        parts.append(f"PSS {_mib(last['host_pss_mib'])}")
    if last.get("tree_cpu_s") is not None:
        parts.append(f"CPU {_num(round(float(last['tree_cpu_s']), 1))} s")
    faults = last.get("gpu_faults") or []
    parts.append("GPU faults: " + (", ".join(
        f"gpu {f.get('gpu_index')} {f.get('kind')}" + (f" ({f['detail']})" if f.get("detail")
                                                       else "")
        for f in faults if isinstance(f, Mapping)) or "none"))
    return f"last sample (source {last.get('source')}): " + ", ".join(parts)


def _nvml_now(gpu: Mapping[str, Any]) -> str:
    """NVML's view while the record was written: device memory and every process on it."""
    extra = [_fact(k, v) for k, v in gpu.items()
             if k not in ("device_used_mib", "processes") and v not in (None, "", [], {})]
    used = gpu.get("device_used_mib") or {}
    procs = gpu.get("processes")
    if not used and procs is None:
        return "NVML now: not read (no GPU in the config, or NVML unavailable)" + (
            f"; {', '.join(extra)}" if extra else "")
    parts = [*extra]
    if used:
        parts.append("device used" + _per_gpu(used, None))
    if procs is not None:
        parts.append("processes: " + (", ".join(
            f"pid {p.get('pid')} on gpu {p.get('gpu_index')} {_mib(p.get('used_mib'))}"
            for p in procs if isinstance(p, Mapping)) or "none"))
    return "NVML now: " + "; ".join(parts)


def _fact(key: str, value: object) -> str:
    if key == "gpus" and isinstance(value, Mapping):  # index -> name
        return ", ".join(f"gpu {g} {name}" for g, name in value.items())
    if isinstance(value, Mapping):
        return f"{key} " + ", ".join(f"{k} {v}" for k, v in value.items())
    return f"{key} {value}"


def _per_gpu(values: object, totals: Mapping[str, Any] | None) -> str:
    if not isinstance(values, Mapping) or not values:
        return ""
    return " (" + ", ".join(
        f"gpu {g} {_mib(v)}" + (f" / {_mib(totals[g])}" if totals and g in totals else "")
        for g, v in sorted(values.items(), key=lambda kv: str(kv[0]))) + ")"


def _mib(v: Any, missing: str = "?") -> str:
    """A MiB figure as a person reads it: whole MiB, or '?' where it was not measured.
    Not units.format_mib: that rounds to a tenth of a GiB, and a record is read to compare
    the tree's figure with NVML's to the MiB."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return missing
    return f"{v:.0f} MiB" if abs(v) >= 10 else f"{v:.1f} MiB"


def _before(t: float) -> str:
    """Seconds relative to the incident in tenths, right-aligned: never "-0.0" (an event
    0.04 s before it, rounded), a sign that read as a time after the incident."""
    return f"{round(t, 1) + 0.0:>10.1f}"  # (+ 0.0 turns -0.0 into 0.0)


def _output(r: Mapping[str, Any]) -> str:
    """The first ERROR/Traceback block of the window (the cause sits above interpreter-exit
    noise, issue 36.17), then the tail."""
    out = list(r.get("output") or [])
    tail_from = max(0, len(out) - OUTPUT_SHOWN)
    first = first_error(out)
    parts = []
    if first is not None and first < tail_from:
        block = out[first:min(first + ERROR_BLOCK, tail_from)]
        said = telling(out, first)  # a traceback longer than the block: its end is the cause
        if first + ERROR_BLOCK <= said < tail_from:
            skipped = said - 4 - (first + ERROR_BLOCK - 6)
            block = [*out[first:first + ERROR_BLOCK - 6],
                     f"... ({skipped} lines; all in output.log) ...", *out[said - 4:said + 1]]
        parts.append(f"== first error in the output (line {first + 1} of {len(out)}) ==\n"
                     + "\n".join(block))
    shown = out[tail_from:]
    parts.append(f"== last output lines ({len(shown)} of {len(out)}; all in output.log) ==\n"
                 + "\n".join(shown))
    return "\n\n".join(parts)
