"""End-to-end: an embedding model on the real CPU vLLM reaches READY through vllmwatch.

The model is the tiny Qwen3 laid out as a sentence-transformers embedding model
(scripts/make_tiny_model.py --kind embed): vLLM picks the pooling runner by itself and has
no /v1/completions route, so the canary has to find /v1/embeddings on its own (auto).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import VENV
from tests.e2e.e2e_harness import REPO, SERVED_NAME, base_url, http, record_times, status
from tests.support import TIMEOUT_SCALE, Daemon, wait_for

pytestmark = pytest.mark.e2e

STARTUP = 300.0 / TIMEOUT_SCALE
EMBED_MODEL = Path(os.environ.get("VLLMWATCH_TINY_EMBED_MODEL",
                                  REPO / ".cache" / "tiny-embed-model"))


@pytest.fixture(scope="session")
def tiny_embed_model(vllm_venv: Path) -> Path:
    """The tiny embedding model; made once, then found complete and reused."""
    subprocess.run([str(VENV / "bin" / "python"), str(REPO / "scripts" / "make_tiny_model.py"),
                    str(EMBED_MODEL), "--kind", "embed"], check=True, timeout=600)
    return EMBED_MODEL


def test_embedding_model_becomes_ready(start_daemon: Callable[..., Daemon],
                                       tiny_embed_model: Path) -> None:
    d = start_daemon({"vllm": {"model": str(tiny_embed_model)},
                      "prewarm": {"enabled": True, "page_cache": False, "kernels": False,
                                  "warmup_request": True}})
    ready = d.wait_ready(STARTUP)
    url = base_url(d)
    code, body = http("POST", url + "/v1/completions",
                      {"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 1})
    assert code == 404, body  # a pooling model: no completions route at all
    code, body = http("POST", url + "/v1/embeddings", {"model": SERVED_NAME, "input": "Hi"})
    assert code == 200 and len(body["data"][0]["embedding"]) == 128, body
    assert [e["kind"] for e in d.named("probe.canary_chosen")] == ["embeddings"], d.dump()
    # The periodic canary (every 3 s) keeps passing: no restart, no canary failure.
    wait_for(lambda: (status(d).get("child_uptime_s") or 0) > 10, 60 / TIMEOUT_SCALE,
             "10 s of uptime after READY", poll=0.5)
    assert status(d).get("probe_failures", {}).get("canary", 0) == 0, d.dump()
    assert not d.named("restart.begin"), d.dump()
    assert not d.named("startup.warmup_failed"), d.dump()
    record_times("embedding_ready", {"startup_s": ready["startup_s"]})
