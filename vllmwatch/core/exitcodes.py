"""The one table of `vllmwatch` exit codes (README, docs/operations/exit-codes.md and the units
rely on it)."""

from __future__ import annotations

OK = 0  # stopped on request; `check` all passed
FAILURE = 1  # a check failed, a required pre-warm step failed, or an internal error
CONFIG = 2  # bad config or vLLM refused its arguments: restarting will not help
GAVE_UP = 3  # crash-loop guard: too many failed restarts in restart.window
START = 4  # cannot start: a foreign process holds vllm.port
START_MEMORY = 5  # vLLM's start kept failing for memory (diagnosed; see core/unified.py)
GPU_FAULT = 6  # a GPU hardware fault (lost, Xid, ECC): a person is needed, not a restart
ALREADY_RUNNING = 7  # another vllmwatch runs this config (instance lock): nothing was touched
INTERNAL = 70  # an unexpected error inside vllmwatch (EX_SOFTWARE); the vLLM tree was killed

MEANING = {
    OK: "stopped on request",
    FAILURE: "failure",
    CONFIG: "bad config, or vLLM refused its arguments (restarting will not help)",
    GAVE_UP: "crash-loop guard gave up",
    START: "cannot start: a foreign process holds the port",
    START_MEMORY: "vLLM's start kept failing for memory (see start.memory_gave_up)",
    GPU_FAULT: "GPU hardware fault: a person is needed (see the gpu.fault event)",
    ALREADY_RUNNING: "another vllmwatch runs this config; this one touched nothing",
    INTERNAL: "internal error in vllmwatch (a bug: please report the logged traceback)",
}
