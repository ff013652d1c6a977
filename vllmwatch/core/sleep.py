"""Pure: vLLM's sleep mode. An engine put to sleep on purpose is not hung.

With `--enable-sleep-mode`, `POST /sleep` frees the weights and KV cache; /health stays 200
while completions are refused (or wait) until `POST /wake_up`. vLLM says so on /metrics:
`vllm:engine_sleep_state{sleep_state="awake"}` is 1 when awake and 0 while asleep (one series
per engine). A canary that fails or times out while asleep proves nothing about a hang, so
while the last scrape said "asleep" the canary is not sent and its results are not judged.
"""

from __future__ import annotations

from collections.abc import Iterable

SERIES = "vllm:engine_sleep_state"


def asleep_from_awake(awake_values: Iterable[float]) -> bool | None:
    """From the `awake` series of each engine: True if any engine sleeps, None if no series.

    None means this vLLM does not report sleep (an older version): judge as before.
    """
    values = list(awake_values)
    if not values:
        return None
    return any(v < 0.5 for v in values)


def send_canary(asleep: bool | None) -> bool:
    """Whether the periodic canary should be sent now."""
    return asleep is not True


def judge_canary(asleep_when_sent: bool | None, asleep_now: bool | None) -> bool:
    """Whether a canary failure or timeout may count toward a restart.

    Not if the engine slept when the canary left or sleeps now (it may have gone to sleep
    while the canary was in flight): in both cases the failure is the sleep, not a fault.
    """
    return asleep_when_sent is not True and asleep_now is not True


def judge_stall(asleep: bool | None) -> bool:
    """Whether "requests waiting but no token generated" may count as a stall."""
    return asleep is not True
