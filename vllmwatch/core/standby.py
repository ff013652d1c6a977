"""Pure: whether a standby interpreter is wanted (how EngineCore starts: config/launch.py).

A standby is vLLM's serve path imported in an idle interpreter ahead of the next launch
(shell/standby.py); it costs about 1 GiB of host RSS (measured on the H200: 1027 MiB).
"""

from __future__ import annotations

# Room the standby needs beside everything else: its ~1 GiB and a margin for the page cache.
ROOM_MIB = 4096.0


def wanted(setting: str, uses_gpu: bool, unified: bool, mem_available_mib: float | None
           ) -> tuple[bool, str]:
    """(on, why) for `[restart] standby` = "auto" | "true" | "false"."""
    if setting == "false":
        return False, "restart.standby = false"
    if setting == "true":
        return True, "restart.standby = true"
    if not uses_gpu:
        return False, "a CPU config (vllm.gpus = []); restart.standby = true turns it on"
    if unified:
        return False, "unified memory: the standby's ~1 GiB of RSS would be GPU memory"
    if mem_available_mib is not None and mem_available_mib < ROOM_MIB:
        return False, (f"MemAvailable {mem_available_mib:.0f} MiB leaves no room "
                       f"(auto wants {ROOM_MIB:.0f} MiB)")
    return True, "auto: a discrete GPU with room in host memory"
