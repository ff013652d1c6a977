"""The cache variables a launch carries (and the standby's next command): our persistent
cache directories, made or said unusable, and vLLM's own start-up caches as
config/startcaches.py decides them for this vLLM. Apart from shell/effects.py because it is
one decision with a memory of its own: the start-up cache decision is logged once per change,
not at every launch (issue 33)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from vllmwatch.config import startcaches
from vllmwatch.config.schema import Config
from vllmwatch.prewarm import runner as prewarm
from vllmwatch.shell.logs import LogFn
from vllmwatch.shell.versions import VersionCache


class CacheEnv:
    """The cache variables per launch; lives as long as the daemon."""

    def __init__(self, log: LogFn, environ: Mapping[str, str], versions: VersionCache,
                 unified: Callable[[], bool]) -> None:
        self.log, self._environ, self._versions, self._unified = log, environ, versions, unified
        # The start-up cache decision last logged (daemon lifetime: said once per change).
        self._said: list[tuple[dict[str, str], dict[str, str]]] = []

    def env(self, config: Config) -> dict[str, str]:
        """The persistent cache variables whose directories we could create; vLLM would crash
        on one it cannot write (e.g. `vllmwatch run` by hand without /var/cache access)."""
        usable, unusable = prewarm.make_cache_dirs(config, self._environ)
        for name, path, why in unusable:
            self.log("warning", "prewarm.cache_unusable", variable=name, path=path,
                     error=why, detail="vLLM keeps its default cache location; "
                     "set prewarm.cache_dir to a writable directory")
        # vLLM's own start-up caches (config/startcaches.py); said once per change.
        decision = startcaches.decide(config, self._environ, self._versions.info,
                                      self._unified())
        said = (decision.env, decision.why)
        if said not in self._said[-1:]:
            self._said[:] = [said]
            self.log("info", "prewarm.start_caches", env=decision.env, why=decision.why,
                     vllm=self._versions.current)
        return {**usable, **decision.env}
