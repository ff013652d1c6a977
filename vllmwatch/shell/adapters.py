"""The adapters' side in the shell (issue 38): live loads and unloads, and what vLLM serves.

A live change (core/lora.py decided it; the core's UpdateAdapters action) is sent to vLLM on
a worker thread of its own, one change at a time, each request bounded (connect to answer,
and the answer's bytes): unloads first, then loads (`load_inplace` for a repointed one).
vLLM's own error (its JSON `error.message`) is kept per adapter. While READY, vLLM's
/v1/models is read at each new child and every REFRESH_EVERY seconds: a configured adapter
it lists is "loaded", one it does not is "missing", and an adapter it lists that the config
does not name was loaded by hand ("unmanaged": lost at the next restart). What the worker
learns is written under a lock and read by the loop's publish (the snapshot's `adapters`).
Imported only when [[adapters]] or [lora] live is configured (shell/effects.py).
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from vllmwatch import bounded_http
from vllmwatch.config import command
from vllmwatch.config.errors import ConfigError
from vllmwatch.config.redact import REDACT
from vllmwatch.config.sections import AdapterConfig, Config
from vllmwatch.logfn import LogFn
from vllmwatch.shell.probes import probe_host
from vllmwatch.status.statusline import systemctl

LOAD_PATH, UNLOAD_PATH, MODELS_PATH = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter",
                                       "/v1/models")
LOAD_TIMEOUT = 120.0  # vLLM reads the adapter's weights before it answers
REQUEST_TIMEOUT = 10.0  # an unload or the model list
MAX_ANSWER = 256 * 1024  # /v1/models with 64 adapters is ~40 KiB
REFRESH_EVERY = 30.0
ERROR_BYTES = 300


def load_body(adapter: AdapterConfig, inplace: bool) -> dict[str, object]:
    """vLLM's LoadLoRAAdapterRequest (vllm/entrypoints/serve/lora/protocol.py)."""
    body: dict[str, object] = {"lora_name": adapter.name, "lora_path": adapter.path}
    if inplace:
        body["load_inplace"] = True
    return body


def unload_body(name: str) -> dict[str, object]:
    """vLLM's UnloadLoRAAdapterRequest."""
    return {"lora_name": name}


def vllm_error(status: int, raw: bytes) -> str:
    """vLLM's own words for a refusal: error.message of its JSON, else the body's start."""
    try:
        message = json.loads(raw)["error"]["message"]
        if isinstance(message, str):
            return f"HTTP {status}: {REDACT.head(message, ERROR_BYTES)}"
    # RecursionError is no ValueError: [[[[...]]]] deeper than Python's stack (it fits
    # MAX_ANSWER) would end the live-change worker with a traceback, the load never counted
    except (ValueError, KeyError, TypeError, RecursionError):
        pass
    text = REDACT.head(raw, ERROR_BYTES).strip()
    return f"HTTP {status}: {text}" if text else f"HTTP {status}"


def serves(roots: Mapping[str, str | None], name: str, path: str) -> bool:
    """vLLM's model list (name -> root) serves adapter `name` from `path`: a configured name
    served from another path (replaced past us) is not the adapter (a root None: by name)."""
    return name in roots and roots[name] in (None, path)


class Engine(Protocol):
    """The running engine, as the watch needs it (shell/childrun.ChildHandle)."""

    @property
    def api_key(self) -> str | None:
        """The key its /v1 routes want (None: none)."""


class Sent:
    """A live change handed to the worker: `done` once vLLM answered it (or failed to)."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def join(self, timeout: float | None = None) -> None:
        """Wait until it is done (at most `timeout` s), as Thread.join does."""
        self.done.wait(timeout)


class AdapterWatch:
    """The configured adapters' state as vLLM last told it, and the live changes."""

    def __init__(self, config: Config, log: LogFn,
                 clock: Callable[[], float] = time.monotonic,
                 environ: Mapping[str, str] | None = None,
                 engine: Callable[[], Engine | None] | None = None) -> None:
        self._log, self._clock = log, clock
        self._environ = os.environ if environ is None else environ  # vLLM's, for the key
        # The running engine (the daemon's: its key is its launch's, as the probes send);
        # without it the next launch's key, read now: after a key file's rotation, before its
        # SIGHUP relaunched, the old engine answered that one 401 ("vLLM refused the adapter")
        self._engine = engine
        self._lock = threading.Lock()
        self._config = config
        self._errors: dict[str, str] = {}  # adapter -> vLLM's refusal of its last load
        self._served: dict[str, str | None] | None = None  # /v1/models' name -> root
        self._pid: int | None = None
        self._left_out: set[str] = set()  # configured, not on the last launch's command line
        # adapter -> the path this child loaded live (200): a second load of the same (the
        # core's change and the retry of one reload) would be refused "already loaded"
        self._ours: dict[str, str] = {}
        self._next_refresh = 0.0
        self._unreadable = ""  # why the last /v1/models answer was not the list ("" read)
        self._busy = threading.Lock()  # one change or refresh at a time
        # Live changes in the order sent, one worker at a time (update, _drain)
        self._queue: list[tuple[Config, tuple[AdapterConfig, ...], tuple[str, ...],
                                tuple[str, ...], Sent]] = []
        self._worker: threading.Thread | None = None
        self.loads_failed = 0  # live loads vLLM refused or that timed out

    def reconfigure(self, config: Config) -> Sent | None:
        """A reload's config (the loop's thread): the adapters now configured. A reload that
        changes none of them retries, live, those vLLM refused or does not list: `lora.
        load_failed` says "fix it, then reload", and the same config read as no change, so
        the fixed adapter waited for a restart. The retry's worker (for tests), or None."""
        with self._lock:
            same = (config.adapters, config.lora) == (self._config.adapters, self._config.lora)
            self._config = config
            names = {a.name for a in config.adapters}
            self._errors = {k: v for k, v in self._errors.items() if k in names}
            self._left_out &= names
            retry = tuple(a for a in config.adapters if a.name in self._errors or (
                self._served is not None and not serves(self._served, a.name, a.path))) \
                if same and config.lora.live and self._served is not None else ()
        if not retry:
            return None
        self._log("info", "lora.retry", adapters=[a.name for a in retry],
                  detail="reloaded with the same adapters: those vLLM refused or does not "
                         "list are loaded again")
        return self.update(retry, (), ())

    # ---- the loop's side ----

    def launched(self, config: Config) -> None:
        """A launch with these adapters: the configured ones it leaves out (vLLM refused one
        at the start before: core/lora.start_refused) are shown as such."""
        with self._lock:
            self._left_out = {a.name for a in self._config.adapters} - {
                a.name for a in config.adapters}

    def update(self, load: tuple[AdapterConfig, ...], unload: tuple[str, ...],
               inplace: tuple[str, ...]) -> Sent:
        """Send a live change off the loop, after the changes sent before it: each SIGHUP's
        change in the order the reloads came (threads queued on a lock could swap two, and
        vLLM end without an adapter the config has). What is returned is done when vLLM
        has answered it (tests join it)."""
        sent = Sent()
        with self._lock:
            self._queue.append((self._config, load, unload, inplace, sent))
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._drain, name="vllmwatch-adapters",
                                                daemon=True)
                self._worker.start()
        return sent

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._worker = None
                    return
                config, load, unload, inplace, sent = self._queue.pop(0)
            try:
                self._update(config, load, unload, inplace)
            finally:
                sent.done.set()

    def observe(self, ready: bool, pid: int | None) -> dict[str, Any]:
        """What /status shows; while READY, a refresh of /v1/models when due (off-loop)."""
        now = self._clock()
        if ready and (pid != self._pid or now >= self._next_refresh):
            if pid != self._pid:
                with self._lock:  # a new child: its own load
                    self._errors, self._served, self._ours = {}, None, {}
            self._pid, self._next_refresh = pid, now + REFRESH_EVERY
            threading.Thread(target=self.refresh, name="vllmwatch-adapters",
                             daemon=True).start()
        return self.view(ready)

    def view(self, ready: bool) -> dict[str, Any]:
        """The adapters' part of /status."""
        with self._lock:
            config, errors, served = self._config, dict(self._errors), self._served
            for name in self._left_out:
                errors.setdefault(name, "left out of this launch: vLLM refused an adapter at "
                                  "start (lora.start_refused in the log has its error)")
        rows = []
        for a in config.adapters:
            if a.name in errors:
                state = "failed"
            elif served is None or not ready:
                state = "unknown"
            else:
                state = "loaded" if serves(served, a.name, a.path) else "missing"
                if a.name in served and state == "missing":
                    errors[a.name] = (f"vLLM serves it from {served[a.name]!r}; a reload (lora"
                                      ".live = true) or the next launch loads the configured one")
            rows.append({"name": a.name, "path": a.path, "required": a.required,
                         "rank": a.rank, "state": state, "error": errors.get(a.name)})
        names = {a.name for a in config.adapters}
        unmanaged = sorted(set(served or ()) - names - {config.vllm.model_name})
        return {"live": config.lora.live, "managed": rows, "unmanaged": unmanaged,
                "loads_failed": self.loads_failed}

    # ---- the worker's side ----

    def _update(self, config: Config, load: tuple[AdapterConfig, ...],
                unload: tuple[str, ...], inplace: tuple[str, ...]) -> None:
        with self._busy:
            for name in unload:
                status, answer = self._post(config, UNLOAD_PATH, unload_body(name),
                                            REQUEST_TIMEOUT)
                # vLLM's 404 for an adapter it does not have: unloaded. A route's own 404
                # (the runtime endpoints are off) says nothing of the adapter: not done.
                if status == 200 or (status == 404 and "cannot be found" in answer):
                    with self._lock:
                        self._ours.pop(name, None)
                    self._log("info", "lora.unloaded", adapter=name)
                else:
                    self._log("error", "lora.unload_failed", adapter=name, error=answer,
                              detail="vLLM still serves it until the next restart")
            for adapter in load:
                inplace_ = adapter.name in inplace
                with self._lock:
                    done = not inplace_ and self._ours.get(adapter.name) == adapter.path
                if done:  # one reload's change and its retry named the same adapter
                    continue
                status, answer = self._post(config, LOAD_PATH, load_body(adapter, inplace_),
                                            LOAD_TIMEOUT)
                how = "live"
                if status == 400 and "already been loaded" in answer and not inplace_:
                    # vLLM serves an adapter of this name we did not load (by hand, past
                    # us): the config's path replaces it, as a repointed one is
                    status, answer = self._post(config, LOAD_PATH, load_body(adapter, True),
                                                LOAD_TIMEOUT)
                    how = "live, in place of an adapter of the same name vLLM served"
                self._loaded(adapter, status, answer, how)
            self._refresh(config)

    def _loaded(self, adapter: AdapterConfig, status: int, answer: str, how: str) -> None:
        if status == 200:
            with self._lock:
                self._errors.pop(adapter.name, None)
                self._ours[adapter.name] = adapter.path
                self._left_out.discard(adapter.name)  # left out of the launch, served now
            self._log("info", "lora.loaded", adapter=adapter.name, path=adapter.path,
                      how=how)
            return
        with self._lock:
            self._errors[adapter.name] = answer
            self.loads_failed += 1
        # No answer (status 0) is no refusal: vLLM may still be reading the weights, or was
        # restarted under the request; "fix it" sent the operator after a sound adapter.
        said = ("vLLM did not answer the load: it may still be loading it (it shows loaded "
                "once vLLM lists it) or vLLM restarted; else send SIGHUP again"
                if status == 0 else "vLLM refused the adapter: fix it and send SIGHUP again")
        self._log("error", "lora.load_failed", adapter=adapter.name, path=adapter.path,
                  required=adapter.required, error=answer,
                  detail=f"{said} ({systemctl('reload')}); the base model and the other "
                         "adapters still serve")

    def refresh(self) -> None:
        """Read /v1/models now (a worker thread)."""
        if self._busy.acquire(blocking=False):
            try:
                self._refresh(self._config)
            finally:
                self._busy.release()

    def _refresh(self, config: Config) -> None:
        status, raw = self._get(config, MODELS_PATH)
        if status != 200:
            return  # unknown stays unknown: the probes say whether vLLM is there
        try:
            roots = {str(m["id"]): m["root"] if isinstance(m.get("root"), str) else None
                     for m in json.loads(raw)["data"]}
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            # (RecursionError: nesting deeper than Python's stack, no ValueError.) A failed
            # refresh: unknown stays unknown, said once per kind of answer, not per refresh
            why = f"{type(exc).__name__}: {REDACT.head(str(exc), ERROR_BYTES)}"
            if why != self._unreadable:
                self._unreadable = why
                self._log("warning", "lora.models_unreadable", path=MODELS_PATH, error=why,
                          detail="vLLM's model list is not the JSON it serves: the adapters "
                                 "show state unknown until it is")
            return
        late = []
        with self._lock:
            self._served, self._unreadable = roots, ""
            # ours only while listed: the retry skipped one unloaded past us as loaded
            self._ours = {n: p for n, p in self._ours.items() if serves(roots, n, p)}
            # A load that failed by its deadline (or was cut) goes on in vLLM: listed under
            # its name with the path we asked for, it is loaded (/status said `failed` while
            # vLLM served it). Listed with another path, a refused repoint: still failed.
            for a in self._config.adapters:
                if a.name in self._errors and roots.get(a.name) == a.path:
                    del self._errors[a.name]
                    self._ours[a.name] = a.path
                    late.append(a)
        for a in late:
            self._log("info", "lora.loaded", adapter=a.name, path=a.path,
                      how="live, late: vLLM lists it with this path after its load failed")

    def _post(self, config: Config, path: str, body: dict[str, object], timeout: float
              ) -> tuple[int, str]:
        """(HTTP status, vLLM's answer in words); status 0 when no answer came."""
        try:
            status, raw = self._request(config, "POST", path, json.dumps(body).encode(),
                                        timeout)
        except bounded_http.DeadlineExceeded:
            return 0, f"no answer within {timeout:g}s"
        except (OSError, http.client.HTTPException) as exc:
            return 0, f"{type(exc).__name__}: {exc}"
        return status, ("ok" if status == 200 else vllm_error(status, raw))

    def _get(self, config: Config, path: str) -> tuple[int, bytes]:
        try:
            return self._request(config, "GET", path, None, REQUEST_TIMEOUT)
        except (OSError, http.client.HTTPException):
            return 0, b""

    def _request(self, config: Config, method: str, path: str, body: bytes | None,
                 timeout: float) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        try:
            if self._engine is None:
                key = command.effective_api_key(config, self._environ)  # as a launch gives it
            else:  # None: no engine runs now
                key = run.api_key if (run := self._engine()) is not None else None
        except ConfigError:
            key = None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        v = config.vllm
        return bounded_http.request(probe_host(v.host), v.port, method, path, timeout=timeout,
                                    max_body=MAX_ANSWER, body=body, headers=headers)
