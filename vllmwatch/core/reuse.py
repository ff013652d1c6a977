"""Pure: what a launch reused of vLLM's own start-up caches, read from vLLM's log lines.

The lines, verbatim from vLLM 0.26 (H200, docs/gpu/h200-round5) and 0.32 (the CPU build),
and from vLLM's source (`v1/worker/startup_plan.py`, `compilation/decorators.py`,
`compilation/backends.py`, `compilation/monitor.py`); tests/core/test_reuse.py holds them:

  Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 1.782 s
  Directly load AOT compilation from path /c/vllm/torch_compile_cache/torch_aot_compile/.../model
  saved AOT compiled function to /c/vllm/torch_compile_cache/torch_aot_compile/.../model
  (the same two lines for the mega AOT artifact: VLLM_USE_MEGA_AOT_ARTIFACT=1 changes what
  the file holds, not what is logged; prewarm.start_caches says which was asked)
  Cannot load aot compilation from path ..., error: ...                        (0.26)
  Compiling model again due to a load failure from ..., reason: ...            (0.32)
  Applying persisted startup plan (fingerprint 0123456789abcdef): kv_cache_memory_bytes=...
  Saved startup plan to /c/vllm/startup_plan/startup_plan_0123456789abcdef.json
  Startup plan not applied: current free memory (130.10 GiB) is below the recorded baseline ...
  Ignoring unreadable startup plan ...: ...
  Loading weights took 2.21 seconds
  torch.compile took 5.03 s in total
  Graph capturing finished in 4 secs, took 1.00 GiB
  init engine (profile, create kv cache, warmup model) took 11.49 s (compilation: 5.03 s)

A launch's facts are a flat dict (JSON in child.ready and /status `start_reuse`):
`aot_loaded`/`aot_saved` (bool), `aot_error`, `startup_plan` ("applied" | "saved" |
"not_applied"), `startup_plan_kv_bytes`, `startup_plan_why`, `weights_s`, `compile_s`,
`graphs_s`, `engine_init_s`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping

from vllmwatch.config.launch import env_file_secret
from vllmwatch.config.redact import REDACT, is_secret_name
from vllmwatch.config.sections import Config
from vllmwatch.core.actions import Log

Facts = tuple[tuple[str, object], ...]  # what one line says (hashable: it rides an event)
Inputs = tuple[tuple[str, str], ...]  # (part, value) as Spawned.inputs carries them

_FLOAT = r"(\d+(?:\.\d+)?)"
_SECONDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("weights_s", re.compile(r"Loading weights took " + _FLOAT + r" s")),
    ("compile_s", re.compile(r"torch\.compile took " + _FLOAT + r" s in total")),
    ("graphs_s", re.compile(r"Graph capturing finished in " + _FLOAT + r" sec")),
    ("engine_init_s", re.compile(r"init engine \(profile, create kv cache, warmup model\) "
                                 r"took " + _FLOAT + r" s")),
)
# The engine line's compile total (vLLM's: each worker's parts, [backbone] + [eagle_head] or an
# encoder, summed; the slowest worker's): one part's "torch.compile took" is not the launch's.
_COMPILATION = re.compile(r" took [\d.]+ s \(compilation: " + _FLOAT + r" s\b")
_PLAN_APPLIED = re.compile(r"Applying persisted startup plan \(fingerprint [0-9a-f]+\): "
                           r"kv_cache_memory_bytes=(\d{1,20})\b")  # (int(): 4300 digits max)
_PLAN_NOT = re.compile(r"(Startup plan not applied: .*|Ignoring unreadable startup plan .*)$")
# 0.26: "Cannot load aot compilation from path P, error: E"; 0.32: "Compiling model again
# due to a load failure from P, reason: E".
_AOT_ERROR = re.compile(r"(?:Cannot load aot compilation from path \S+, error: "
                        r"|Compiling model again due to a load failure from \S+, reason: )(.*)$")
WHY_MAX = 300  # characters of vLLM's own reason kept


def facts_of(line: str) -> Facts:
    """The reuse facts one vLLM line states (empty for almost every line: cheap checks)."""
    if "took" in line:
        for key, pattern in _SECONDS:
            match = pattern.search(line)
            if match:
                total = _COMPILATION.search(line) if key == "engine_init_s" else None
                return ((key, float(match.group(1))),
                        *((("compile_s", float(total.group(1))),) if total else ()))
    if "startup plan" in line.lower():
        match = _PLAN_APPLIED.search(line)
        if match:
            return (("startup_plan", "applied"), ("startup_plan_kv_bytes", int(match.group(1))))
        if "Saved startup plan to " in line:
            return (("startup_plan", "saved"),)
        match = _PLAN_NOT.search(line)
        if match:
            return (("startup_plan", "not_applied"),
                    ("startup_plan_why", REDACT.head(match.group(1), WHY_MAX)))
    if "AOT compil" in line or "aot compilation" in line or "load failure" in line:
        if "Directly load AOT compilation from path" in line:
            return (("aot_loaded", True),)
        if "saved AOT compiled function to" in line:
            return (("aot_saved", True),)
        match = _AOT_ERROR.search(line)
        if match:
            return (("aot_error", REDACT.head(match.group(1), WHY_MAX)),)
    return ()


def merge(old: Mapping[str, object], new: Facts) -> dict[str, object]:
    """One launch's facts so far plus one line's. With several workers (TP), a plan that any
    rank did not apply is not applied; the largest seconds count (slowest rank, compile total)."""
    out = dict(old)
    for key, value in new:
        if key == "startup_plan" and out.get(key) == "not_applied":
            continue
        if key.endswith("_s") and isinstance(value, float):
            prev = out.get(key)
            value = max(value, prev) if isinstance(prev, float) else value
        out[key] = value
    return out


def hits(facts: Mapping[str, object], compile_cache_hit: bool) -> dict[str, bool]:
    """Which cache this launch read: compile cache, AOT artifact, startup plan. With several
    workers (TP) or compiled parts, each loads its own artifact: one that failed compiled
    again (its torch.compile seconds), so the launch did not reuse the artifact."""
    return {"compile_cache": compile_cache_hit, "aot_artifact": aot_loaded(facts),
            "startup_plan": facts.get("startup_plan") == "applied"}


def aot_loaded(facts: Mapping[str, object]) -> bool:
    """Every worker's AOT artifact loaded: one said it did, and none failed to."""
    return facts.get("aot_loaded") is True and "aot_error" not in facts


# Why a cache that hit last time missed now, where vLLM did not say (issue 33).
_LIKELY = {
    "compile_cache": "the compile-cache key changed (vLLM or torch upgraded, [vllm.args] or "
                     "a compile variable such as VLLM_USE_MEGA_AOT_ARTIFACT changed), or "
                     "the cache under prewarm.cache_dir was cleared",
    "aot_artifact": "the AOT artifact's key changed (vLLM, torch or the model's source "
                    "changed) or the cache under prewarm.cache_dir was cleared",
    "startup_plan": "the plan's key changed (config, vLLM, device or torch/CUDA), the plan "
                    "file was removed, or the start-up cache switch was turned off",
}


# The startup plan beside the awake spare (issue 34): vLLM applies a plan only while free GPU
# memory is at least the baseline recorded with it, and the plan is recorded beside the
# sleeping spare (~2 GiB); a failover's relaunch starts beside the awake one (its KV cache
# too), so vLLM skips it and profiles. vllmwatch lets vLLM decide, as anywhere: that miss
# is expected, said once (failover.startup_plan), and not remembered as the last launch's.
BESIDE_AWAKE = ("the relaunch started beside the awake spare (a failover): free GPU memory "
                "was below the plan's baseline, recorded beside the sleeping spare, so vLLM "
                "profiled instead (a few seconds more); the next launch beside the sleeping "
                "spare applies it again")


def kept(before: Mapping[str, bool], now: dict[str, bool], awake: bool) -> dict[str, bool]:
    """The hits the next launch is compared with: a plan missed beside the awake spare keeps
    the last launch's (a later miss beside the sleeping spare is still a miss)."""
    if awake and not now.get("startup_plan", False):
        return {**now, "startup_plan": before.get("startup_plan", False)}
    return now


def inputs(config: Config) -> dict[str, str]:
    """What of vllmwatch's config the caches of a launch are keyed on or placed by: the
    prewarm switches by value, the vLLM command, model, flags, GPUs, environment (its
    table and vllm.env_file's path) and the LoRA size [[adapters]]/[lora] add by digest (a
    value there may be a secret, and this rides the state that records keep). Secret-named
    flags and variables are left out: a rotated token or key keys no cache, and would
    "explain" (hide) a miss that something else caused."""
    p, v = config.prewarm, config.vllm
    out = {f"prewarm.{k}": str(getattr(p, k)).lower() if k != "cache_dir" else p.cache_dir
           for k in ("enabled", "cache_dir", "startup_plan", "mega_aot_artifact")}
    # vllm.gpus: another card is another device in the plan's and the compile cache's keys;
    # vllm.env_file: other variables (its path here; its content is read at the launch, so
    # the shell adds it with the versions: launch_inputs)
    hidden = {"vllm.command": repr(v.command), "vllm.model": v.model,
              "vllm.extra_args": repr(v.extra_args), "vllm.gpus": repr(v.gpus),
              "vllm.env_file": v.env_file,
              **{f"vllm.args.{k}": repr(val) for k, val in v.args.items()
                 if not is_secret_name(k)},
              **{f"vllm.env.{k}": val for k, val in v.env.items() if not is_secret_name(k)}}
    if config.adapters:  # --enable-lora --max-loras N --max-lora-rank R: vLLM's LoRA config,
        from vllmwatch.config import adapters  # part of its compile-cache key (not the list
        # of modules); imported only when configured (the daemon's import count)
        plan = adapters.plan(config)
        hidden["lora (--max-loras, --max-lora-rank)"] = repr((plan.max_loras, plan.max_lora_rank))
    return {**out, **{k: hashlib.sha256(val.encode()).hexdigest()[:16]
                      for k, val in hidden.items()}}


# Beyond the config, what the shell knows at a launch that vLLM's caches are keyed on
# (Spawned.inputs; reuse.launched adds them to the launch's inputs): the installed vLLM
# and torch by value (no secret; the 3 a.m. line names the upgrade), vllm.env_file's variables
# by digest (read at the launch: an edit of the file under the same path changes the key).
# Compared only where both launches knew them (a version read that timed out explains nothing).
VLLM, TORCH, ENV_FILE = "vllm.version", "torch.version", "vllm.env_file.contents"
LAUNCH = {VLLM: "vLLM", TORCH: "torch", ENV_FILE: "vllm.env_file's variables"}


def launch_inputs(version: str | None, torch: str | None,
                  env_file: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The launch's LAUNCH parts: its vLLM and torch versions (where known), and a digest of
    vllm.env_file's variables without the secret ones (a rotated token keys no cache;
    the file's flags are its secret channel: left out too)."""
    keyed = json.dumps(sorted((k, v) for k, v in env_file.items()  # (GH_PAT=ghp_... too:
                              if not env_file_secret(k, v)))  # the redactor's own judgement)
    known = tuple((part, value) for part, value in ((VLLM, version), (TORCH, torch)) if value)
    return (*known, (ENV_FILE, hashlib.sha256(keyed.encode()).hexdigest()[:16]))


def launched(config_inputs: Mapping[str, str], spawned: Inputs) -> dict[str, str]:
    """A launch's inputs: its config's (reuse.inputs when it began, not a reload's since) and
    the LAUNCH parts of what the shell read for it (Spawned.inputs)."""
    return {**config_inputs, **{part: value for part, value in spawned if part in LAUNCH}}


# Which switch concerns which cache: turning the plan off explains no compile-cache miss.
_ONLY = {"prewarm.startup_plan": ("startup_plan",),
         "prewarm.mega_aot_artifact": ("compile_cache", "aot_artifact")}


def changed(before: Mapping[str, str], now: Mapping[str, str], cache: str) -> list[str]:
    """The config keys a reload changed that `cache` depends on; the prewarm switches with
    their values ("prewarm.startup_plan (auto -> false)"), the rest by name only."""
    out = []
    for key in sorted(set(before) | set(now)):
        if before.get(key) == now.get(key) or cache not in _ONLY.get(key, (cache,)) or \
                (key in LAUNCH and (key not in before or key not in now)):
            continue
        out.append(f"{key} ({before.get(key, 'unset')} -> {now.get(key, 'unset')})"
                   if key.startswith("prewarm.") else key)
    return out


def _since(moved: list[str], before: Mapping[str, str], now: Mapping[str, str]) -> str:
    """The cause in words: "a reload changed K1, K2" for config keys; the installed vLLM or
    torch with both versions, and vllm.env_file's variables, as changed since that launch."""
    keys = [k for k in moved if k not in LAUNCH]
    other = [f"{LAUNCH[k]} {before[k]} -> {now[k]} (installed since the launch that hit)"
             if k in (VLLM, TORCH) else f"{LAUNCH[k]} changed since the launch that hit"
             for k in moved if k in LAUNCH]
    return "; ".join(["a reload changed " + ", ".join(keys)] * bool(keys) + other)


def misses(before: Mapping[str, bool], now: Mapping[str, bool],
           facts: Mapping[str, object], inputs_before: Mapping[str, str] | None = None,
           inputs_now: Mapping[str, str] | None = None) -> list[tuple[str, str, bool]]:
    """[(cache, likely cause, expected)] for each cache the last READY launch hit and this one
    missed. The cause is vLLM's own message where it gave one; else a change since that
    launch of what the cache is keyed on (a reload's config key, an upgraded vLLM or torch,
    vllm.env_file's variables) where there was one: then the miss is expected (a cache keyed
    on it is written anew, one switched off is not read); else the usual causes."""
    out = []
    for cache, hit in before.items():
        if not hit or now.get(cache, False):
            continue
        said = facts.get("startup_plan_why") if cache == "startup_plan" else \
            facts.get("aot_error") if cache in ("aot_artifact", "compile_cache") else None
        moved = [] if said or not inputs_before or not inputs_now else \
            changed(inputs_before, inputs_now, cache)
        out.append((cache, f"vLLM said: {said}", False) if said else
                   (cache, _since(moved, inputs_before or {}, inputs_now or {}), True)
                   if moved else
                   (cache, _LIKELY[cache], False))
    return out


def missed_logs(before: Mapping[str, bool], inputs_before: Mapping[str, str],
                now: Mapping[str, bool], facts: Mapping[str, object],
                inputs_now: Mapping[str, str], awake: bool) -> list[Log]:
    """What a READY launch says of the caches it missed (issue 33): a warning naming the cache
    and the likely cause, as info where a reload explains it; beside the awake spare the plan's
    miss is expected, said once as failover.startup_plan (BESIDE_AWAKE)."""
    out = []
    for cache, why, expected in misses(before, now, facts, inputs_before, inputs_now):
        if cache == "startup_plan" and awake:
            out.append(Log("info", "failover.startup_plan", {
                "applied": False, "vllm_said": why, "detail": BESIDE_AWAKE}))
            continue
        out.append(Log("info" if expected else "warning", "startup.cache_missed", {
            "cache": cache, "likely_cause": why, "expected": expected,
            "detail": f"this launch did not reuse the {cache.replace('_', ' ')} that the last "
                      "one did; its start took longer" + (
                          " (expected after that change)" if expected else "")}))
    return out


# The start-up steps (shell/childlog milestones) at or after vLLM's compile: before one, no
# hit line is no miss (a launch killed while loading weights, or one still loading).
_PAST_COMPILE = frozenset(("compile", "kv_cache", "graphs_start", "graphs", "engine_init",
                           "server_start", "api_ready", "canary", "ready"))


def one_line(facts: Mapping[str, object], compile_cache_hit: bool | None,
             phases: object = None) -> str:
    """The reuse of a launch in one line, for `vllmwatch status` and the incident report.
    `phases`: the launch's start-up steps (start_phases_s), where known: a miss is said only
    once vLLM got to its compile, "not reached" before."""
    parts = []
    reached = not isinstance(phases, Mapping) or "compile_s" in facts or \
        bool(_PAST_COMPILE.intersection(phases))
    if compile_cache_hit is not None:
        parts.append("compile cache " + ("hit" if compile_cache_hit else
                                         "miss" if reached else "not reached"))
    if aot_loaded(facts):
        parts.append("AOT artifact loaded")
    elif facts.get("aot_loaded") is True:
        parts.append("AOT artifact partly loaded (the rest compiled again)")
    elif facts.get("aot_saved") is True:
        parts.append("AOT artifact written")
    plan = facts.get("startup_plan")
    kv = facts.get("startup_plan_kv_bytes")
    if plan == "applied":
        parts.append("startup plan applied" + (f" (KV {kv / 2**30:.1f} GiB)"
                                               if isinstance(kv, int) else ""))
    elif plan == "saved":
        parts.append("startup plan written")
    elif plan == "not_applied":
        parts.append("startup plan not applied")
    timing = [f"{label} {facts[key]:g} s" for key, label in (
        ("weights_s", "weights"), ("compile_s", "torch.compile"), ("graphs_s", "CUDA graphs"),
        ("engine_init_s", "engine init")) if isinstance(facts.get(key), float)]
    return "; ".join(p for p in (", ".join(parts), ", ".join(timing)) if p) or "nothing known"


# A write that failed for a full disk (or a quota): vLLM's compile (Inductor's C++ build and
# `ld`), its caches and its temporary files all write there, and the start then fails with
# "Engine core initialization failed. See root cause above", the cause far above its last
# lines. Seen with vLLM 0.32 (CPU) on a full VLLM_CACHE_ROOT: "/usr/bin/ld: final link
# failed: No space left on device".
_DISK_FULL = re.compile(r"No space left on device|Disk quota exceeded|\[Errno (?:28|122)\]")


def disk_full_line(line: str) -> bool:
    """Whether a child line says a write failed for a full disk (cheap for every line)."""
    return ("space" in line or "quota" in line or "Errno" in line) and \
        _DISK_FULL.search(line) is not None


def disk_full(config: Config, lines: tuple[str, ...], kept: tuple[str, ...] = (),
              start: bool = True) -> list[Log]:
    """child.disk_full (error) when the exited child's output says a write failed for a full
    disk: what to free, before the restarts (and the crash-loop guard) that would follow.
    `lines`: its last lines; `kept`: the run's full-disk lines, far above them, judged for a
    start only: a serving vLLM's may be hours old (an adapter's download that failed on a disk
    freed since, a request's text), and its crash now for another cause was named a full disk."""
    line = next((ln for ln in (*(kept if start else ()), *lines) if disk_full_line(ln)), None)
    if line is None:
        return []
    where = config.vllm.env.get("VLLM_CACHE_ROOT") or (
        f"prewarm.cache_dir ({config.prewarm.cache_dir}, or systemd's CacheDirectory=)"
        if config.prewarm.enabled else "~/.cache/vllm")
    return [Log("error", "child.disk_full", {
        "line": REDACT.head(line, 300),
        "detail": "vLLM failed writing to a full disk: it writes its compile caches under "
                  f"{where} and temporary files under TMPDIR",
        "hint": "free space on that disk (old compile caches: docs/operations/restarts.md, "
                "Clearing); vllmwatch restarts with backoff meanwhile, until the crash-loop "
                "guard stops"})]

