"""vLLM's /metrics in a record: the last scrape, and which series moved since an earlier one.

A hung engine freezes its counters, a leak moves a gauge: the report shows what changed
between the oldest scrape kept (about ten minutes back) and the last one, and how old the
last one is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

KEEP_EVERY_S = 60.0  # scrapes kept for comparison: one a minute ...
KEEP = 10  # ... ten of them


def vllm_lines(text: str) -> str:
    """Only vLLM's own sample lines (no HELP/TYPE, no process_ or python_ series)."""
    return "\n".join(ln for ln in text.splitlines() if ln.startswith("vllm:")) + "\n"


def keep(scrapes: list[tuple[float, str]], wall: float, text: str) -> list[tuple[float, str]]:
    """Add a scrape: the newest replaces the last one unless that one is a minute newer
    than the one kept before it (so all but the newest are a minute apart)."""
    text = vllm_lines(text)
    if len(scrapes) >= 2 and scrapes[-1][0] - scrapes[-2][0] < KEEP_EVERY_S:
        scrapes = scrapes[:-1]
    return [*scrapes, (wall, text)][-KEEP:]


def parse(text: str) -> dict[str, float]:
    """`name{labels} value` lines to a dict (histogram buckets left out)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if not name or "_bucket{" in name:
            continue
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def section(scrapes: Sequence[tuple[float, str]], wall: float) -> dict[str, Any]:
    """The record's metrics: the last scrape (parsed), its age, and what moved."""
    if not scrapes:
        return {"last": None, "note": "no /metrics scrape succeeded for this child"}
    last_at, last_text = scrapes[-1]
    last = parse(last_text)
    out: dict[str, Any] = {"last_age_s": round(wall - last_at, 1), "last": last,
                           "last_text": last_text, "summary": summary(scrapes, wall)}
    if len(scrapes) >= 2:
        first_at, first_text = scrapes[0]
        first = parse(first_text)
        moved = [[name, first.get(name), value] for name, value in last.items()
                 if not _same(first.get(name), value)]
        out.update({"since_s": round(last_at - first_at, 1), "moved": moved,
                    "unchanged": sorted(n for n, v in last.items() if _same(first.get(n), v))})
    return out


_SUMMED = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
           "kv_cache_usage": "vllm:kv_cache_usage_perc", "kv_cache_usage_old":
           "vllm:gpu_cache_usage_perc", "generation_tokens": "vllm:generation_tokens_total",
           "prompt_tokens": "vllm:prompt_tokens_total",
           "requests_finished": "vllm:request_success_total"}


_FULLEST = frozenset({"kv_cache_usage", "kv_cache_usage_old"})  # a fraction per engine


def totals(series: dict[str, float]) -> dict[str, float]:
    """The few series a person asks about first, summed over their labels (engines); the KV
    cache's use is each engine's fraction of its own cache: the fullest, never a sum (two
    engines at 90 % are not 180 %)."""
    out: dict[str, float] = {}
    for name, value in series.items():
        base = name.split("{")[0]
        for key, wanted in _SUMMED.items():
            if base == wanted and not math.isnan(value):
                out[key] = max(out.get(key, 0.0), value) if key in _FULLEST else \
                    out.get(key, 0.0) + value
    if "kv_cache_usage" not in out and "kv_cache_usage_old" in out:
        out["kv_cache_usage"] = out["kv_cache_usage_old"]
    out.pop("kv_cache_usage_old", None)
    return out


def summary(scrapes: Sequence[tuple[float, str]], wall: float) -> dict[str, Any]:
    """Issue 36.18: running/waiting/KV use now, the rates over the window, and when the
    generation tokens last moved (between two kept scrapes), before the full list."""
    kept = [(at, totals(parse(text))) for at, text in scrapes]
    last_at, last = kept[-1]
    out: dict[str, Any] = {k: last.get(k) for k in ("running", "waiting", "kv_cache_usage")}
    first_at, first = kept[0]
    span = last_at - first_at
    if span > 0:
        for key in ("generation_tokens", "prompt_tokens", "requests_finished"):
            if key in last and key in first:
                # three significant digits: one request in 10 min is 0.00167/s, not 0
                out[f"{key}_per_s"] = float(f"{(last[key] - first[key]) / span:.3g}")
    out["window_s"] = round(span, 1)
    moved = None
    for (at0, a), (at1, b) in zip(kept[-2::-1], kept[:0:-1], strict=True):  # newest pair first
        if a.get("generation_tokens") != b.get("generation_tokens"):
            moved = [round(wall - at1, 1), round(wall - at0, 1)]
            break
    out["tokens_last_moved_s_ago"] = moved  # [newest, oldest] bound; None: not in the window
    return out


def _same(a: float | None, b: float) -> bool:
    return a is not None and (a == b or (math.isnan(a) and math.isnan(b)))
