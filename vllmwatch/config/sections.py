"""The config's sections as typed, frozen dataclasses: every key, its kind, bounds and default
(the only home of defaults). Loading and validation are in schema; checks across sections in
crosschecks."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from vllmwatch.config.bounds import DAY

if TYPE_CHECKING:  # imported at run time only when a config has [[smoke]] (import count)
    from vllmwatch.config.smoke import SmokeCheck

HOUR = 3600.0


def _conv(kind: str, default: object, **extra: Any) -> Any:
    """A dataclass field carrying how to convert and describe its TOML value."""
    if isinstance(default, (list, dict)):
        # A fresh copy per instance; frozen dataclasses still share mutable defaults otherwise.
        return field(default_factory=lambda: type(default)(default),
                     metadata={"kind": kind, **extra})
    return field(default=default, metadata={"kind": kind, **extra})


@dataclass(frozen=True)
class VllmConfig:
    """How to launch the supervised vLLM server."""

    model: str = _conv("name", "")
    command: list[str] = _conv("command", ["vllm", "serve"])
    served_model_name: str = _conv("name", "")
    host: str = _conv("host", "127.0.0.1")
    port: int = _conv("port", 8000)
    gpus: list[int] | None = _conv("gpus", None)
    env: dict[str, str] = _conv("str_table", {})
    args: dict[str, object] = _conv("args_table", {})
    extra_args: list[str] = _conv("str_list", [])
    api_key_file: str = _conv("path", "")
    env_file: str = _conv("path", "")  # secret variables (and flag values) kept out of here

    @property
    def model_name(self) -> str:
        """The name clients (and our canary) use for the model."""
        return self.served_model_name or self.model

    @property
    def uses_gpu(self) -> bool:
        """False only for a config that says `gpus = []` (a CPU deployment)."""
        return self.gpus is None or len(self.gpus) > 0


@dataclass(frozen=True)
class StartupConfig:
    """Limits on a start: total time and time without log progress."""

    timeout: float = _conv("duration", 1800.0, low=1.0)
    stall_timeout: float = _conv("duration", 300.0, low=1.0)


@dataclass(frozen=True)
class ProbeConfig:
    """Health, metrics and canary probing."""

    interval: float = _conv("duration", 5.0)
    timeout: float = _conv("duration", 5.0, high=HOUR)
    failure_threshold: int = _conv("pos_int", 3)
    metrics_interval: float = _conv("duration", 2.0)
    # Issue 24: the canary's timeout follows its own latencies (core/hangs.py) between
    # canary_timeout_min and canary_timeout; progress_timeout is the frozen-engine verdict.
    canary_interval: float = _conv("duration", 2.0)
    canary_timeout: float = _conv("duration", 30.0, high=HOUR)
    canary_timeout_min: float = _conv("duration", 2.0, high=HOUR)
    canary_timeout_margin: float = _conv("pos_float", 4.0)
    progress_timeout: float = _conv("duration", 8.0, high=HOUR, zero="off")
    # Issue 37.8: how long "busy" (the engine's counters move) may excuse canaries that never
    # answer; past it, a hang (an API server wedged while its engine works). Never off.
    busy_timeout: float = _conv("duration", 600.0, low=1.0, high=HOUR)
    canary_prompt: str = _conv("str", "Hello")
    stall_timeout: float = _conv("duration", 300.0, low=1.0)
    # The canary follows the model (issue 16): see core/canary.py and _canary_checks below.
    canary: str = _conv("choice", "auto", choices=("auto", "completions", "chat", "embeddings",
                                                   "score", "rerank", "classify", "pooling",
                                                   "custom"))
    canary_path: str = _conv("str", "")
    canary_body: str = _conv("str", "")


@dataclass(frozen=True)
class MemoryConfig:
    """Memory sampling and the leak rules; a limit left at 0 is off."""

    sample_interval: float = _conv("duration", 10.0)
    pss_interval: float = _conv("duration", 60.0)
    gpu_limit: float = _conv("size", 0.0)
    gpu_growth_limit: float = _conv("size", 0.0)
    gpu_growth_rate: float = _conv("rate", 0.0)
    host_limit: float = _conv("size", 0.0)
    host_growth_limit: float = _conv("size", 0.0)
    host_growth_rate: float = _conv("rate", 0.0)
    baseline_delay: float = _conv("duration", 600.0, zero="take the baseline at READY")
    slope_window: float = _conv("duration", 21600.0, low=10.0)
    sustain: int = _conv("pos_int", 3)
    # -- unified memory (DGX Spark): detection, the start guard, memory-failure retries --
    unified: str = _conv("auto_bool", "auto")  # "auto" | "true" | "false"
    guard: bool = _conv("bool", True)  # the start guard on unified memory (never on discrete)
    guard_floor: float = _conv("size", 0.0, zero="auto: max(4GiB, 5% of MemTotal)")
    guard_interval: float = _conv("duration", 1.0, high=60.0)
    guard_min_gap: float = _conv("duration", 5.0, high=HOUR, zero="act at every sample")
    guard_drop_caches: bool = _conv("bool", False)  # echo 1 > /proc/sys/vm/drop_caches (root)
    guard_compact: bool = _conv("bool", False)  # echo 1 > /proc/sys/vm/compact_memory (root)
    start_memory_retries: int = _conv("pos_int", 2, high=100)  # memory-failed starts retried


@dataclass(frozen=True)
class RestartConfig:
    """The restart ladder, backoff and crash-loop guard."""

    drain_timeout: float = _conv("duration", 30.0, high=DAY, zero="no drain: stop at once")
    stop_timeout: float = _conv("duration", 30.0, high=HOUR)
    backoff_initial: float = _conv("duration", 5.0, high=DAY)
    backoff_max: float = _conv("duration", 300.0, high=DAY)
    backoff_multiplier: float = _conv("pos_float", 2.0)
    backoff_jitter: float = _conv("fraction", 0.2, zero="no jitter")
    stable_after: float = _conv("duration", 600.0, low=1.0)
    max_restarts: int = _conv("pos_int", 5)
    window: float = _conv("duration", 1800.0, low=1.0)
    kill_stale: bool = _conv("bool", True)
    quiet_hours: str = _conv("quiet_hours", "")
    quiet_hours_spread: float = _conv("fraction", 0.5, zero="no spread: the window as written")
    gpu_release_timeout: float = _conv("duration", 60.0, high=DAY,
                                       zero="do not wait for the GPU to release memory")
    gpu_release_tolerance: float = _conv("size", 512.0,
                                         zero="device memory must return to its exact level")
    # A pre-imported interpreter for the next launch (shell/standby.py, config/launch.py).
    standby: str = _conv("auto_bool", "auto")  # "auto" | "true" | "false"
    standby_imports: list[str] = _conv("str_list", [])  # more modules it imports ahead


@dataclass(frozen=True)
class PrewarmConfig:
    """What to do before a start so that it is fast."""

    enabled: bool = _conv("bool", True)
    cache_dir: str = _conv("dir", "/var/cache/vllmwatch")
    page_cache: bool = _conv("bool", True)
    page_cache_max_fraction: float = _conv("fraction", 0.5,
                                           zero="never read weights into the page cache")
    page_cache_workers: int = _conv("pos_int", 4, high=256)
    kernels: bool = _conv("bool", False)  # off: ~13 s before each start, no gain (docs/GPU.md)
    warmup_request: bool = _conv("bool", True)
    timeout: float = _conv("duration", 600.0, high=DAY)
    required: bool = _conv("bool", False)
    # vLLM's own start-up caches under the cache dir (config/startcaches.py, issue 33).
    startup_plan: str = _conv("auto_bool", "auto")  # "auto" | "true" | "false"
    mega_aot_artifact: str = _conv("auto_bool", "auto")  # "auto" | "true" | "false"


@dataclass(frozen=True)
class StatusConfig:
    """The read-only HTTP status listener."""

    listen: str = _conv("str", "127.0.0.1:9101")
    allow_remote: bool = _conv("bool", False)


@dataclass(frozen=True)
class LogConfig:
    """Logging of our events and of the child's lines."""

    level: str = _conv("choice", "info", choices=("debug", "info", "warning", "error"))
    format: str = _conv("choice", "auto", choices=("auto", "journal", "json", "console"))
    child_lines: bool = _conv("bool", True)


# --- [drain] and [gate] (issue 15: restarts that clients do not see) ---------------------


@dataclass(frozen=True)
class DrainConfig:
    """How a planned restart leaves a load balancer: /readyz 503, then wait, then drain."""

    # A balancer stops routing after interval x fall failed checks (e.g. 2 s x 3 = 6 s);
    # 10 s covers that with a margin. 0 stops as soon as nothing is in flight.
    deregister_delay: float = _conv("duration", 10.0, high=HOUR,
                                    zero="stop as soon as nothing is in flight")


@dataclass(frozen=True)
class GateConfig:
    """The optional front door: hold requests while vLLM (re)starts instead of failing them."""

    enabled: bool = _conv("bool", False)
    listen: str = _conv("str", "")  # the public HOST:PORT; vllm.port becomes the private one
    hold_timeout: float = _conv("duration", 120.0, high=DAY)
    retry_after: float = _conv("duration", 10.0, high=DAY)
    # Requests vLLM never began to answer are sent once more to the next engine (gate/replay.py)
    replay: bool = _conv("bool", True)
    replay_max: int = _conv("pos_int", 1, high=10)


@dataclass(frozen=True)
class SpareConfig:
    """A sleeping spare engine that takes the traffic while the serving engine restarts
    (issue 34). Needs the gate; config/spare.py plans it (imported only when considered)."""

    # "auto": on where it fits beside the operator's own setting as it is (never changes it);
    # true: lowers the serving engine's setting to make room; false: never.
    enabled: str = _conv("auto_bool", "auto")  # "auto" | "true" | "false"
    kv_cache: float = _conv("size", 8192.0, low=64.0, zero=None)  # the spare's own KV cache
    retries: int = _conv("pos_int", 3, high=100)  # failed builds, then off until a reload
    # The spare's --gpu-memory-utilization: only vLLM's start-up check reads it when the KV
    # cache is sized in bytes, so the smallest that covers its footprint.
    utilization: float = _conv("fraction", 0.0, high=0.5,
                               zero="auto: the spare's footprint, rounded up")
    wake_timeout: float = _conv("duration", 10.0, high=HOUR)  # /wake_up to a canary answered

    def considered(self, gate_enabled: bool) -> bool:
        """Whether a plan is made at all (false, or auto with the gate off: never; so the
        daemon imports config/spare.py only then)."""
        return self.enabled == "true" or (self.enabled == "auto" and gate_enabled)

    def restart_keys(self, new: SpareConfig, gate_enabled: bool, planned: bool) -> tuple[
            str, ...]:
        """The [spare] keys of a reload (`self`: the started config's) that only a restart of
        vllmwatch applies: all that changed, when no spare was planned at the start (its
        plan measures the GPU while it is ours alone, and the gate and sweep learn its
        socket then) and the new [spare] would be considered; none when it was planned
        (a reload turns it off, on again, or re-plans it)."""
        if planned or not new.considered(gate_enabled):
            return ()
        return tuple(f"spare.{f.name}" for f in fields(self)
                     if getattr(self, f.name) != getattr(new, f.name))


@dataclass(frozen=True)
class IncidentsConfig:
    """Incident records (vllmwatch/incident/): the evidence of every unplanned restart."""

    enabled: bool = _conv("bool", True)
    max_records: int = _conv("pos_int", 50, high=10000)
    max_size: float = _conv("size", 200.0, zero="no bound on size")  # MiB over all records
    # The dumper's deadline: a restart waits at most this long (plus a second) for the record.
    timeout: float = _conv("duration", 3.0, high=60.0)
    output_lines: int = _conv("pos_int", 300, high=100000)  # vLLM's last lines kept


# --- [[adapters]] and [lora] (issue 38: LoRA adapters that survive restarts) -------------


@dataclass(frozen=True)
class AdapterConfig:
    """One [[adapters]] entry: a LoRA adapter vLLM is launched with (config/adapters.py)."""

    name: str
    path: str
    required: bool = True  # false: READY for the base model even when this one fails
    rank: int = 0  # not a key: read from the adapter's adapter_config.json when loaded


@dataclass(frozen=True)
class LoraConfig:
    """How adapters are served: at launch only, or also loaded live on a SIGHUP."""

    live: bool = _conv("bool", False)  # VLLM_ALLOW_RUNTIME_LORA_UPDATING and its endpoints
    max_loras: int = _conv("auto_int", 0, high=64, zero="auto: the number of adapters")
    max_lora_rank: int = _conv("auto_int", 0, high=512,
                               zero="auto: the adapters' largest r, rounded up")


@dataclass(frozen=True)
class Config:
    """The whole configuration, plus where it came from."""

    vllm: VllmConfig = field(default_factory=VllmConfig)
    startup: StartupConfig = field(default_factory=StartupConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    restart: RestartConfig = field(default_factory=RestartConfig)
    prewarm: PrewarmConfig = field(default_factory=PrewarmConfig)
    status: StatusConfig = field(default_factory=StatusConfig)
    log: LogConfig = field(default_factory=LogConfig)
    drain: DrainConfig = field(default_factory=DrainConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    incidents: IncidentsConfig = field(default_factory=IncidentsConfig)
    spare: SpareConfig = field(default_factory=SpareConfig)
    smoke: tuple[SmokeCheck, ...] = ()  # [[smoke]]: checks before READY (config/smoke.py)
    lora: LoraConfig = field(default_factory=LoraConfig)
    adapters: tuple[AdapterConfig, ...] = ()  # [[adapters]]: an array of tables, not in SECTIONS
    path: str = ""
    sha256: str = ""


SECTIONS: dict[str, type] = {
    "vllm": VllmConfig,
    "startup": StartupConfig,
    "probe": ProbeConfig,
    "memory": MemoryConfig,
    "restart": RestartConfig,
    "prewarm": PrewarmConfig,
    "status": StatusConfig,
    "log": LogConfig,
    "drain": DrainConfig,
    "gate": GateConfig,
    "incidents": IncidentsConfig,
    "spare": SpareConfig,
    "lora": LoraConfig,
}
