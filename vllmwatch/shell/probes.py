"""HTTP probes of the vLLM server: /health, /metrics (a few series), a real request (canary);
and the host's CPU pressure that a /metrics scrape carries (sample_host_cpu, at the end).

The canary's kind follows the model (core/canary.py): `auto` finds the first kind whose
route the server has and says so in the result; the core keeps it for the rest of the child's
run (ChildRun.canary.kind) and names it in the next Probe.
"""

from __future__ import annotations

import http.client
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from prometheus_client.parser import text_string_to_metric_families

from vllmwatch import bounded_http
from vllmwatch.config.hosts import connect_host
from vllmwatch.config.redact import REDACT
from vllmwatch.config.schema import Config, ProbeConfig
from vllmwatch.core import canary as kinds
from vllmwatch.core import hangs
from vllmwatch.core.events import CanaryResult, HealthResult, MetricsResult
from vllmwatch.core.hangs import HostCpu

# Only these series are parsed; filtering the 48 KB text first cuts a ~7 ms parse to ~0.2 ms.
_WANTED = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
           "vllm:gpu_cache_usage_perc", "vllm:prompt_tokens_total",
           "vllm:generation_tokens_total")
_FRACTIONS = frozenset({"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"})
WARMUP_PROMPT = "Write one short sentence about the sea."
# Bodies read at most (issue 22): vLLM's /metrics is ~50 KB (a few MB with many LoRAs).
MAX_BODY = {"/metrics": 16 * 2**20, "/health": 64 * 2**10}
MAX_ANSWER = 4 * 2**20  # a canary's answer (a few tokens): anything larger is refused


class Prober(Protocol):
    """The probes the loop runs (in worker threads)."""

    def health(self) -> HealthResult:
        """GET /health."""
        ...

    def canary(self, warmup: bool = False) -> CanaryResult:
        """A real request of the model's kind (or the warm-up request)."""
        ...

    def metrics(self) -> MetricsResult:
        """GET /metrics, reduced to the series the policies need."""
        ...


probe_host = connect_host  # one home for the wildcard-to-loopback rule: config/hosts.py


@dataclass(frozen=True)
class Endpoint:
    """Where vLLM listens, the model it serves, and the API key its /v1 routes want."""

    host: str
    port: int
    model: str
    api_key: str | None = None


def prober_for(config: Config, api_key: str | None, log: Callable[..., None] | None = None
               ) -> HttpProber:
    """The prober for a config: where vLLM listens, the model, which canary."""
    v = config.vllm
    return HttpProber(Endpoint(v.host, v.port, v.model_name, api_key), config.probe,
                      order=kinds.order(config.probe.canary, v.args, v.extra_args), log=log)


class HttpProber:
    """Probes over plain HTTP/1.1, one connection per request (no shared state).

    `order`: the canary kinds `auto` tries (core/canary.py `order`, from the child's vLLM
    arguments); `chosen`: the kind an earlier canary of this child found, which is tried alone.
    """

    def __init__(self, endpoint: Endpoint, probe: ProbeConfig, *,
                 order: Sequence[str] | None = None, chosen: str | None = None,
                 log: Callable[..., None] | None = None) -> None:
        self.host, self.port = probe_host(endpoint.host), endpoint.port
        self.model, self.api_key = endpoint.model, endpoint.api_key
        self.timeout, self.canary_timeout = probe.timeout, probe.canary_timeout
        self.prompt, self.canary_kind = probe.canary_prompt, probe.canary
        self.canary_path, self.canary_body = probe.canary_path, probe.canary_body
        self._order = tuple(order) if order is not None else kinds.order(probe.canary)
        # auto: found by the first canary that answers; it comes back in CanaryResult.kind.
        self.chosen: str | None = chosen if probe.canary == "auto" else probe.canary
        self._log = log
        self.last_metrics_text: str | None = None  # the body of the last /metrics answer

    def _request(self, method: str, path: str, timeout: float, body: bytes | None = None
                 ) -> tuple[int, bytes]:
        """One request, `timeout` for the whole of it (a trickling server fails at it)."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if self.api_key and path.startswith("/v1/"):
            headers["Authorization"] = f"Bearer {self.api_key}"
        return bounded_http.request(self.host, self.port, method, path, timeout=timeout,
                                    max_body=MAX_BODY.get(path, MAX_ANSWER), body=body,
                                    headers=headers)

    def health(self) -> HealthResult:
        """GET /health; ok only for 200."""
        t0 = time.monotonic()
        try:
            status, _ = self._request("GET", "/health", self.timeout)
        except (OSError, http.client.HTTPException) as exc:
            return HealthResult(False, None, time.monotonic() - t0, _describe(exc),
                                timed_out=isinstance(exc, TimeoutError))
        return HealthResult(status == 200, status, time.monotonic() - t0,
                            "" if status == 200 else f"HTTP {status}")

    def canary(self, warmup: bool = False) -> CanaryResult:
        """One real request of the model's kind (auto: the first kind the server has)."""
        t0 = time.monotonic()
        if self.chosen is not None:
            kind = kinds.warmup_kind(self.chosen) if warmup else self.chosen
            result, _ = self._try(kind, warmup, t0)
            return result
        missing = []
        for kind in self._order:
            result, absent = self._try(kind, warmup, t0)
            if not absent:
                if result.ok:
                    self._choose(kind)
                    result = replace(result, kind=kind)
                return result
            missing.append(kinds.PATHS.get(kind, kind))
        return CanaryResult(False, False, time.monotonic() - t0,
                            f"no canary route: {', '.join(missing)} answered 404; set "
                            "probe.canary (and canary_path/canary_body for custom)", warmup)

    def _choose(self, kind: str) -> None:
        self.chosen = kind
        if self._log is not None:
            self._log("info", "probe.canary_chosen", kind=kind, path=kinds.PATHS.get(kind))

    def _try(self, kind: str, warmup: bool, t0: float) -> tuple[CanaryResult, bool]:
        """(result, route missing) of one request of `kind`."""
        prompt = WARMUP_PROMPT if warmup else self.prompt
        path, payload = kinds.request(kind, self.model, prompt, self.canary_path,
                                      self.canary_body)
        if warmup and kind == "chat":
            payload["max_tokens"] = 8
        try:
            status, body = self._request("POST", path, self.canary_timeout,
                                         json.dumps(payload).encode())
        except TimeoutError:
            return CanaryResult(False, True, time.monotonic() - t0, "timed out", warmup), False
        except (OSError, http.client.HTTPException) as exc:
            return (CanaryResult(False, False, time.monotonic() - t0, _describe(exc), warmup),
                    False)
        took = time.monotonic() - t0
        if status != 200:
            absent = kinds.route_missing(status, body) and self.canary_kind == "auto"
            return CanaryResult(False, False, took, f"HTTP {status} from {path}: "
                                f"{REDACT.head(body, 200)!r}", warmup), absent
        problem = kinds.answer_problem(kind, body)
        if problem:  # a 200 that is not the answer (HTML, empty): a failure, never READY
            return CanaryResult(False, False, took, f"HTTP 200 from {path} but {problem}",
                                warmup), False
        return CanaryResult(True, False, took, "", warmup), False

    def metrics(self) -> MetricsResult:
        """GET /metrics and pick the queue, KV-cache and token series."""
        t0 = time.monotonic()
        try:
            status, body = self._request("GET", "/metrics", self.timeout)
        except (OSError, http.client.HTTPException) as exc:
            return MetricsResult(False, time.monotonic() - t0, error=_describe(exc))
        if status != 200:
            return MetricsResult(False, time.monotonic() - t0, error=f"HTTP {status}")
        text = body.decode("utf-8", "replace")
        self.last_metrics_text = text  # for an incident record
        try:
            values, awake = parse_metrics(text), awake_values(text)
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            # vLLM's text is not Prometheus' format: a failed scrape, never a traceback.
            return MetricsResult(False, time.monotonic() - t0,
                                 error=f"malformed /metrics ({type(exc).__name__}: "
                                       f"{REDACT.head(str(exc), 200)})")
        return MetricsResult(
            True, time.monotonic() - t0,
            running=values.get("vllm:num_requests_running"),
            waiting=values.get("vllm:num_requests_waiting"),
            kv_cache_usage=values.get("vllm:kv_cache_usage_perc",
                                      values.get("vllm:gpu_cache_usage_perc")),
            prompt_tokens=values.get("vllm:prompt_tokens_total"),
            generation_tokens=values.get("vllm:generation_tokens_total"),
            asleep=hangs.asleep_from_awake(awake))


def filter_lines(text: str, wanted: Iterable[str] = _WANTED) -> str:
    """Keep only the sample lines of the wanted series (no HELP/TYPE, no other series)."""
    keep = tuple(wanted)
    return "\n".join(ln for ln in text.splitlines() if ln.startswith(keep)) + "\n"


def parse_metrics(text: str) -> dict[str, float]:
    """Sum each wanted series over its label sets (engines, models); a KV cache's use is a
    fraction of each engine's own cache: the fullest engine's, never a sum."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(filter_lines(text)):
        for sample in family.samples:
            if sample.name in _WANTED:
                value = float(sample.value)
                out[sample.name] = max(out.get(sample.name, 0.0), value) \
                    if sample.name in _FRACTIONS else out.get(sample.name, 0.0) + value
    return out


def awake_values(text: str) -> list[float]:
    """The `awake` sample of vllm:engine_sleep_state for each engine (none on older vLLM)."""
    out = []
    for family in text_string_to_metric_families(filter_lines(text, (hangs.SLEEP_SERIES,))):
        out += [float(x.value) for x in family.samples
                if x.name == hangs.SLEEP_SERIES and x.labels.get("sleep_state") == "awake"]
    return out


def _describe(exc: BaseException) -> str:
    if isinstance(exc, bounded_http.DeadlineExceeded):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return f"{type(exc).__name__}: {exc}"


# --- the host's CPU pressure at a scrape (was shell/hostcpu.py) ------------------------------
# The host's CPU pressure, read for the core's slow-or-hung verdict (core/hangs.py).
#
# PSI (`/proc/pressure/cpu`, Linux >= 4.20) says how much of the last 10 s some runnable task
# waited for a CPU: exactly "this box is starved". Without it (older kernels, some
# containers) the 1-minute load average per CPU stands in. Reading both costs microseconds.

PSI_PATH = "/proc/pressure/cpu"


def psi_some_avg10(text: str) -> float | None:
    """The `some avg10=` figure of a PSI file's text, or None when it has none."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "some":
            for item in fields[1:]:
                name, _, value = item.partition("=")
                if name == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return None
    return None


def sample_host_cpu(psi_path: str = PSI_PATH) -> HostCpu:
    """Read PSI and the load average now; a figure that cannot be read is None."""
    try:
        with open(psi_path, encoding="ascii") as f:
            psi = psi_some_avg10(f.read())
    except (OSError, UnicodeDecodeError):
        psi = None
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        load = None
    return HostCpu(psi, load)
