"""The real daemon picks the canary that the model serves: an embedding model's, and the
hint from [vllm.args]."""

from __future__ import annotations

from pathlib import Path

from tests.support import Daemon, base_config, free_port, wait_for


def test_the_daemon_finds_an_embedding_models_canary(tmp_path: Path) -> None:
    """An embedding model no flag reveals: auto finds /v1/embeddings after one 404."""
    d = Daemon(tmp_path, base_config(free_port(), free_port(), ["--fake-embedding-model"]))
    d.start()
    try:
        d.wait_ready(30)
        d.wait_event("probe.canary_chosen", 10)
        assert [e["kind"] for e in d.named("probe.canary_chosen")] == ["embeddings"]

        def posts(path: str) -> int:  # the fake logs each request it serves, like uvicorn
            return sum(f'"POST {path} ' in e.get("text", "") for e in d.named("child.line"))

        # Later canaries (every 1 s) go straight to /v1/embeddings: completions was asked once.
        wait_for(lambda: posts("/v1/embeddings") >= 4, 20, "four canaries on /v1/embeddings")
        assert posts("/v1/completions") == 1
        # (a health probe late on a loaded box is no failure of the canary's choice)
        assert not d.named("probe.failed", probe="canary") and not d.named("restart.begin")
    finally:
        d.close()


def test_the_daemon_takes_the_hint_from_vllm_args(tmp_path: Path) -> None:
    """`runner = "pooling"` in [vllm.args]: auto tries embeddings first, never completions."""
    config = base_config(free_port(), free_port())
    config["vllm"]["args"] = {"runner": "pooling"}
    d = Daemon(tmp_path, config)
    d.start()
    try:
        d.wait_ready(30)
        assert [e["kind"] for e in d.named("probe.canary_chosen")] == ["embeddings"]
        assert not [e for e in d.named("child.line") if '"POST /v1/completions ' in e["text"]]
    finally:
        d.close()
