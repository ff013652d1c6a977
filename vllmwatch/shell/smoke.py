"""Perform one smoke check (a Smoke action) against the child: one request, read with the
probes' bounds (one deadline for the whole request, the canary's byte cap), judged by
core/smokeanswers.py. Runs in a worker thread; imported only when a start has checks."""

from __future__ import annotations

import http.client
import json
import time

from vllmwatch import bounded_http
from vllmwatch.config.hosts import connect_host
from vllmwatch.config.redact import REDACT, Redactor
from vllmwatch.core import smokeanswers
from vllmwatch.core.actions import Smoke
from vllmwatch.core.events import SmokeResult
from vllmwatch.core.smoke import ANSWER_BYTES
from vllmwatch.shell.probes import MAX_ANSWER


def run(action: Smoke, api_key: str | None, redactor: Redactor = REDACT) -> SmokeResult:
    """Send the check's request and judge the answer; never raises for I/O."""
    path, payload = smokeanswers.request(action.check, action.model_name)
    headers = {"Content-Type": "application/json"}
    if api_key:  # vLLM's key guards /v1; the Anthropic route takes it as a bearer token too
        headers["Authorization"] = f"Bearer {api_key}"
    t0 = time.monotonic()
    try:
        status, body = bounded_http.request(
            connect_host(action.host), action.port, "POST", path, timeout=action.timeout,
            max_body=MAX_ANSWER, body=json.dumps(payload).encode(), headers=headers)
    except bounded_http.DeadlineExceeded as exc:
        return _result(action, t0, f"{path}: {exc}", b"", redactor)
    except TimeoutError:
        return _result(action, t0, f"{path}: timed out after {action.timeout:g}s", b"",
                       redactor)
    except bounded_http.BodyTooLarge as exc:
        return _result(action, t0, f"{path}: answer too large ({exc})", b"", redactor)
    except (OSError, http.client.HTTPException) as exc:
        return _result(action, t0, f"{path}: {type(exc).__name__}: {exc}", b"", redactor)
    why = smokeanswers.problem(action.check, status, body)
    return _result(action, t0, why, body, redactor)


def _result(action: Smoke, t0: float, error: str, body: bytes, redactor: Redactor
            ) -> SmokeResult:
    return SmokeResult(action.index, not error, time.monotonic() - t0,
                       redactor.head(error, 1000),
                       redactor.head(body, ANSWER_BYTES) if error else "", gen=action.gen)
