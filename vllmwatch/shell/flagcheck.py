"""The daemon's check of [vllm.args] before a launch, without ever blocking the loop.

Asking vLLM for its flags imports torch (5-40 s), and the launch runs on the loop thread,
which must answer SIGTERM at every moment. So a launch consults only the on-disk cache
(microseconds). When this vLLM's flags are not cached yet, a background thread asks vLLM
and fills the cache, and the launch goes ahead unchecked (logged): the next launch, and
`vllmwatch check`, use the answer. `vllmwatch check` without --fast fills the cache too.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from vllmwatch.config import vllmflags
from vllmwatch.config.schema import Config
from vllmwatch.logfn import LogFn

_asking: set[tuple[str, ...]] = set()
_lock = threading.Lock()


def refusal(config: Config, environ: Mapping[str, str], version: str | None,
            log: LogFn) -> str | None:
    """Why this launch must not happen (flags this vLLM rejects), or None to go ahead.

    Call it from RealEffects.spawn after command.build; a text means
    `SpawnFailed(text, fatal=True)`: vLLM would exit at once with "unrecognized arguments".
    """
    cache = vllmflags.default_cache_dir(config, environ)
    known = vllmflags.known_flags(config.vllm.command, version, cache, ask=False)
    if known is None:
        if version is not None:
            _learn(config, version, cache, log)
        return None
    return vllmflags.refusal_text(config, known)


def _learn(config: Config, version: str, cache: str, log: LogFn) -> None:
    key = (version, *config.vllm.command)
    with _lock:
        if key in _asking:
            return
        _asking.add(key)
    log("info", "vllm.flags_unchecked", version=version,
        detail="this vLLM's flags are not cached yet; asking it in the background, the next "
               "launch checks [vllm.args] (or run `vllmwatch check` now)")

    def ask() -> None:
        try:
            got = vllmflags.known_flags(config.vllm.command, version, cache)
            if got is None:
                log("warning", "vllm.flags_unknown", version=version,
                    detail="cannot ask vLLM for its flags; [vllm.args] stays unchecked")
        finally:
            with _lock:
                _asking.discard(key)

    threading.Thread(target=ask, name="vllm-flags", daemon=True).start()
