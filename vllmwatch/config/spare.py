"""Pure: the plan of the sleeping spare engine ([spare], issue 34 point 1): on or off and why,
the spare's own flags, the serving engine's setting before -> after, the figures behind both.

Interface (for the spare lifecycle, `check` and /status; nothing here does I/O):
    facts = SpareFacts(platform="discrete" | "unified" | "cpu", gpu_total_mib=..., ...)
    plan = plan_spare(config.spare, config.gate.enabled, flags, facts)
      flags: the serving command's {flag-name: value} ([vllm.args] + extra_args, dashes)
      facts.measured: the spare's measured Footprint once it has run (awake, asleep); the
      plan then uses it instead of the estimates
    plan.on; plan.reason (why off, or why on); plan.todo (exactly what to change; "" if on)
    plan.spare_flags: {flag: value} to set on the spare's argv (True: a switch), with
      plan.spare_env ({"VLLM_SERVER_DEV_MODE": "1"}); apply with with_flags(argv, ...)
    plan.serving_flags: {flag: value} to set on the serving engine's argv ({} for auto)
    plan.serving_before / serving_after: its gpu-memory-utilization, before -> after
    plan.fields(): the figures for log events and /status; plan.lines(): text for people
Only `considered` configs are planned (SpareConfig.considered): the daemon imports this
module only then, so `vllmwatch run` at the defaults never does.

The arithmetic. vLLM's start refuses when free GPU memory < utilization x total
(`request_memory()`, vllm/v1/worker/utils.py, 0.26 and 0.32), also when the KV cache is
sized in bytes (the spare's case), so the spare's utilization is the smallest that covers
its footprint, and the serving engine's is bounded by what the spare leaves:
  spare awake A = weights + kv_cache + AWAKE_EXTRA (the estimate E; measured when known)
  spare utilization u_sp = ceil3(E / T)   (T: the GPU's total; E stays its base once
      measured, so that a measurement never changes the spare's command)
  room R = max(u_sp T, A)
  serving u <= floor2((T - R - SERVING_EXTRA - others - SAFETY) / T)
so that (1) a spare rebuilt beside the serving engine passes request_memory (u_sp T free),
(2) the spare wakes beside a running or dying serving tree without an OOM (A <= R), and
(3) a serving engine relaunched beside the awake spare passes request_memory. On the H200
(T = 143,771 MiB, 8B: 15.9 GiB weights, kv_cache 8 GiB): A ~ 27,546 MiB estimated (27,202
measured), u_sp = 0.192, serving 0.90 -> 0.78 (issue 34's table: 113,968 MiB at 0.78 beside
the asleep spare's 1,932 MiB; 141,095 of 143,771 MiB with the spare awake).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from vllmwatch.config.sections import SpareConfig
from vllmwatch.config.spareargs import (
    ceil3,
    floor2,
    human_int,
    kv_bytes_per_token,
    parallel_size,
    with_flags,
)

__all__ = ["Footprint", "SpareFacts", "SparePlan", "human_int", "kv_bytes_per_token",
           "parallel_size", "plan_spare", "static_problem", "with_flags"]

VLLM_DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default (0.26, 0.32)
# Beyond weights + KV: CUDA context, activations, CUDA graphs. H200 8B: 27,202 MiB awake for
# 16,282 of weights + 8,192 of KV = 2,728 MiB; rounded up.
AWAKE_EXTRA_MIB = 3072.0
ASLEEP_MIB = 2048.0  # what a level-1 sleep keeps on the GPU: 1,932 MiB measured (H200 8B)
# A serving engine uses more than utilization x total: 113,968 MiB at 0.78 of 143,771 MiB
# (1,827 MiB over its budget: CUDA graphs and context), rounded up.
SERVING_EXTRA_MIB = 2048.0
OTHERS_FLOOR_MIB = 512.0  # other processes' GPU memory, at least (673 MiB seen on the H200)
SAFETY_MIB = 1024.0  # never a wake that can OOM: fragmentation, growth under load
# Host memory of the spare beside its pinned weights backup: ~25 GiB RSS with 15.9 GiB of
# weights backed up (H200 8B), so ~9 GiB of its own processes.
HOST_EXTRA_MIB = 9216.0
HOST_MARGIN_MIB = 4096.0  # left to everything else on the host
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}
Platform = Literal["discrete", "unified", "cpu"]


@dataclass(frozen=True)
class Footprint:
    """The spare's GPU memory, measured (NVML, its tree): awake (READY) and asleep (level 1)."""

    awake_mib: float
    asleep_mib: float


@dataclass(frozen=True)
class SpareFacts:
    """What the plan needs to know of the machine, vLLM and the model; None: unknown."""

    platform: Platform = "discrete"
    gpu_total_mib: float | None = None
    others_mib: float | None = None  # GPU memory held by processes not of this deployment
    host_available_mib: float | None = None  # MemAvailable with the spare not running
    sleep_mode: bool | None = None  # the installed vLLM has --enable-sleep-mode
    uds: bool | None = None  # ... and --uds
    weights_mib: float | None = None  # the model's weights on the GPU (~2 bytes/param bf16)
    kv_bytes_per_token: int | None = None  # kv_bytes_per_token(config.json, kv-cache-dtype)
    model_max_len: int | None = None  # the model's own context length (config.json)
    model_problem: str | None = None  # why config.json gave no figure (file, key, value)
    # Where the spare listens (a socket in vllmwatch's private runtime directory); empty (as
    # for `check`): spare_flags gets no --uds, and the caller must give the spare an address.
    uds_path: str = ""
    measured: Footprint | None = None


@dataclass(frozen=True)
class SparePlan:
    """The decision and its numbers; see the module's docstring for the interface."""

    on: bool
    reason: str
    todo: str = ""
    enabled: str = "auto"
    spare_flags: Mapping[str, str | bool] = field(default_factory=dict)
    spare_env: Mapping[str, str] = field(default_factory=dict)
    serving_flags: Mapping[str, str] = field(default_factory=dict)
    serving_before: float | None = None
    serving_after: float | None = None
    spare_utilization: float | None = None
    awake_mib: float | None = None
    asleep_mib: float | None = None
    kv_given_up_mib: float | None = None  # the serving engine's budget given up for the spare
    host_needed_mib: float | None = None
    host_available_mib: float | None = None
    kv_tokens: int | None = None  # tokens the spare's KV cache holds
    max_model_len: int | None = None
    measured: bool = False  # the footprint figures are measured, not estimated
    notes: tuple[str, ...] = ()

    def fields(self) -> dict[str, object]:
        """The plan as flat key-values for log events and /status (MiB, fractions)."""
        out: dict[str, object] = {"on": self.on, "enabled": self.enabled, "reason": self.reason}
        for name in ("todo", "serving_before", "serving_after", "spare_utilization",
                     "awake_mib", "asleep_mib", "kv_given_up_mib", "host_needed_mib",
                     "host_available_mib", "kv_tokens", "max_model_len"):
            value = getattr(self, name)
            if value not in (None, ""):
                out[name] = round(value) if name.endswith("_mib") else value
        if self.on:
            out["measured"] = self.measured
        return out

    def lines(self) -> list[str]:
        """What a person reads: the decision, then the figures, then notes."""
        if not self.on:
            return [f"off: {self.reason}" + (f"; {self.todo}" if self.todo else ""),
                    *self.notes]
        how = "measured" if self.measured else "estimated"
        out = [f"on ({self.reason}): spare {_gib(self.awake_mib)} awake, "
               f"{_gib(self.asleep_mib)} asleep ({how}), gpu-memory-utilization "
               f"{self.spare_utilization:g}, KV {self.kv_tokens or '?'} tokens for "
               f"max-model-len {self.max_model_len or '?'}"]
        if self.serving_after != self.serving_before:
            out.append(f"serving engine gpu-memory-utilization {self.serving_before:g} -> "
                       f"{self.serving_after:g} ({_gib(self.kv_given_up_mib)} of its KV "
                       "cache budget given up for the spare)")
        else:
            out.append(f"serving engine unchanged at gpu-memory-utilization "
                       f"{self.serving_before:g}")
        out.append(f"host memory: {_gib(self.host_needed_mib)} for the spare (pinned weights "
                   f"backup + its processes), {_gib(self.host_available_mib)} available")
        return out + list(self.notes)


def _gib(mib: float | None) -> str:
    return "? GiB" if mib is None else f"{mib / 1024:.1f} GiB"


def spare_gpu(gpus: Sequence[int] | None, seen: Iterable[int]) -> int | None:
    """The one GPU the spare shares with the serving engine (TP x PP = 1): vllm.gpus' first,
    else the first NVML shows. Every figure of the spare (its plan's total and others, the
    free memory its wake needs, the release gate's device figure) reads this GPU of the
    config current at that moment: a reload may change vllm.gpus."""
    if gpus:
        return gpus[0]
    return min(seen, default=None)


def _number(flags: Mapping[str, object], name: str, default: float) -> float | None:
    value = flags.get(name, default)
    if isinstance(value, bool):
        return None
    try:
        return float(str(value))
    except ValueError:
        return None


def serving_utilization(flags: Mapping[str, object]) -> float | None:
    """The serving engine's --gpu-memory-utilization in `flags` (dashes), else vLLM's
    default; None: not a number."""
    return _number(flags, "gpu-memory-utilization", VLLM_DEFAULT_UTILIZATION)


def static_problem(spare: SpareConfig, gate_on: bool, flags: Mapping[str, object],
                   cpu: bool, unified: bool) -> tuple[str, str] | None:
    """(why off, what to change) for what the config alone rules out; None otherwise."""
    if not gate_on:
        return ("the gate is off (the spare needs it: clients keep one address, the gate "
                "routes to whichever engine serves)",
                'set [gate] enabled = true and listen = "HOST:PORT" (vllm.port moves to a '
                "private port)")
    if cpu:
        return ("a CPU deployment (vllm.gpus = []): vLLM's sleep mode exits there",
                "run on a GPU, or set spare.enabled = false")
    if unified:
        return ("unified memory (e.g. DGX Spark): the spare's weights backup in host memory "
                "is the same memory it would free", "set spare.enabled = false")
    size = parallel_size(flags)
    if size > 1:
        return (f"tensor x pipeline parallel size is {size}: the spare is sized and measured "
                "for one GPU", "set spare.enabled = false, or serve on one GPU")
    return None


def plan_spare(spare: SpareConfig, gate_on: bool, flags: Mapping[str, object],
               facts: SpareFacts) -> SparePlan:
    """The spare's plan for this config, serving command and machine (see the module doc)."""
    enabled = spare.enabled
    if enabled == "false":
        return SparePlan(False, "spare.enabled = false", enabled=enabled)
    static = static_problem(spare, gate_on, flags, facts.platform == "cpu",
                            facts.platform == "unified")
    if static is not None:
        return SparePlan(False, static[0], static[1], enabled)
    return _sized(spare, flags, facts)


def _off(enabled: str, why: str, todo: str, notes: Sequence[str] = ()) -> SparePlan:
    return SparePlan(False, why, todo, enabled, notes=tuple(notes))


def _sized(spare: SpareConfig, flags: Mapping[str, object], facts: SpareFacts) -> SparePlan:
    """The sizes, once the config allows a spare at all."""
    enabled, notes = spare.enabled, []
    if facts.sleep_mode is False:
        return _off(enabled, "the installed vLLM has no --enable-sleep-mode",
                    "upgrade vLLM (0.26 and 0.32 have it), or set spare.enabled = false")
    if facts.sleep_mode is None:
        notes.append("not checked: whether the installed vLLM has sleep mode")
    if facts.uds is None:
        notes.append("not checked: whether the installed vLLM has --uds")
    if facts.uds is False:  # off for `true` too: vllmwatch reaches the spare only on its
        # socket, and without one the spare would bind the serving command's own --port
        return _off(enabled, "vLLM has no --uds: the spare's dev-mode endpoints (/sleep, "
                    "/wake_up, /collective_rpc, ...) would listen on a loopback port that "
                    "every local user can reach, without the API key; vllmwatch runs the "
                    "spare only on a private Unix socket", "upgrade vLLM (0.26 and 0.32 have "
                    "--uds), or set spare.enabled = false")
    total = facts.gpu_total_mib
    if total is None or total <= 0:
        return _off(enabled, "the GPU's total memory is unknown (NVML not readable)",
                    "install nvidia-ml-py and check the driver (`vllmwatch check` says why)")
    before = serving_utilization(flags)
    if before is None:
        return _off(enabled, "vllm.args.gpu-memory-utilization is not a number",
                    "set it to a fraction such as 0.9")
    kv_mib = spare.kv_cache
    est = (facts.weights_mib + kv_mib + AWAKE_EXTRA_MIB if facts.weights_mib is not None
           else None)
    if facts.measured is not None:
        awake, asleep = facts.measured.awake_mib, facts.measured.asleep_mib
    elif est is not None:
        awake, asleep = est, ASLEEP_MIB
    else:
        return _off(enabled, "the model's weight size is unknown (no local weight files)",
                    "download the model to a local directory, or set spare.enabled = false")
    tokens, kv_problem = _kv_fit(kv_mib, flags, facts)
    if kv_problem is not None:
        return _off(enabled, kv_problem[0], kv_problem[1])
    if tokens is None:
        why = facts.model_problem or "the model's config.json is not readable"
        notes.append(f"not checked: whether the spare's KV cache holds one max-model-len "
                     f"request ({why})")
    # The spare's own utilization comes from the estimate where there is one, measured or
    # not: a measurement must not change the spare's command (a reload would call the
    # running spare stale and rebuild it); a spare larger than its budget is met by `room`.
    u_sp = spare.utilization or ceil3((est if est is not None else awake) / total)
    if spare.utilization and u_sp * total < awake:
        return _off(enabled, f"spare.utilization {u_sp:g} x {total:.0f} MiB is below the "
                    f"spare's {awake:.0f} MiB", f"set spare.utilization to at least "
                    f"{ceil3(awake / total):g}, or 0 (auto)")
    room = max(u_sp * total, awake)  # free for a rebuild's start check, and for its wake
    others = max(facts.others_mib or 0.0, OTHERS_FLOOR_MIB)
    bound = floor2((total - room - SERVING_EXTRA_MIB - others - SAFETY_MIB) / total)
    host_need = (facts.weights_mib if facts.weights_mib is not None
                 else max(0.0, awake - kv_mib - AWAKE_EXTRA_MIB)) + HOST_EXTRA_MIB
    host = facts.host_available_mib
    if host is not None and host_need > host - HOST_MARGIN_MIB:
        return _off(enabled, f"host memory: the spare needs {_gib(host_need)} (pinned "
                    f"weights backup + its processes) and {_gib(host)} is available (keeping "
                    f"{_gib(HOST_MARGIN_MIB)} for the rest)",
                    "free host memory or add more, or set spare.enabled = false")
    if host is None:
        notes.append("not checked: the host's available memory")
    if bound < 0.05:
        return _off(enabled, f"no room: the spare ({_gib(awake)} awake, utilization "
                    f"{u_sp:g}) leaves the serving engine {bound:g} of the GPU",
                    "lower spare.kv_cache, or set spare.enabled = false")
    serving: dict[str, str] = {}
    after = before
    if before > bound:
        if enabled == "auto":
            margin = SERVING_EXTRA_MIB + others + SAFETY_MIB
            return _off(enabled, f"no room beside the operator's setting: gpu-memory-"
                        f"utilization {before:g} leaves less than the spare's {u_sp:g} "
                        f"(+ {_gib(margin)} margin) of {_gib(total)}",
                        f"set vllm.args.gpu-memory-utilization to at most {bound:g}, or "
                        f"spare.enabled = true to lower it ({before:g} -> {bound:g})")
        after = bound
        serving["gpu-memory-utilization"] = f"{bound:g}"
    if "kv-cache-memory-bytes" in flags:
        notes.append("the serving engine sizes its KV cache in bytes "
                     f"(kv-cache-memory-bytes {flags['kv-cache-memory-bytes']}): check that it "
                     f"fits in {bound:g} of the GPU")
    spare_flags: dict[str, str | bool] = {
        "enable-sleep-mode": True, "gpu-memory-utilization": f"{u_sp:g}",
        "kv-cache-memory-bytes": str(int(kv_mib * 2**20))}
    if facts.uds_path:  # (a vLLM known to lack --uds was turned off above)
        spare_flags["uds"] = facts.uds_path
    why = ("auto: it fits beside the operator's setting as it is" if enabled == "auto"
           else "spare.enabled = true")
    return SparePlan(
        True, why, "", enabled, spare_flags, dict(DEV_MODE), serving, before, after, u_sp,
        awake, asleep, (before - after) * total, host_need, host, tokens,
        _max_len(flags, facts), facts.measured is not None, tuple(notes))


def _max_len(flags: Mapping[str, object], facts: SpareFacts) -> int | None:
    raw = flags.get("max-model-len")
    got = human_int(raw) if raw is not None else None
    return got if got is not None and got > 0 else facts.model_max_len


def _kv_fit(kv_mib: float, flags: Mapping[str, object], facts: SpareFacts
            ) -> tuple[int | None, tuple[str, str] | None]:
    """(tokens the spare's KV holds, None) or (.., (why off, todo)) when one request of
    max-model-len does not fit (vLLM refuses to start then: "... larger than the available KV
    cache memory")."""
    per = facts.kv_bytes_per_token
    if per is None or per <= 0:
        return None, None
    tokens = int(kv_mib * 2**20 // per)
    want = _max_len(flags, facts)
    if want is None or tokens >= want:
        return tokens, None
    need_gib = math.ceil(want * per / 2**30)
    return tokens, (f"spare.kv_cache {kv_mib / 1024:g} GiB holds {tokens} tokens "
                    f"({per} bytes each) and one request of max-model-len {want} needs "
                    f"{want * per / 2**30:.1f} GiB: vLLM would refuse to start the spare",
                    f"set spare.kv_cache to at least \"{need_gib}GiB\", or lower "
                    "vllm.args.max-model-len")
