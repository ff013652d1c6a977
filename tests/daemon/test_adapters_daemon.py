"""[[adapters]] through `vllmwatch run` over the fake vLLM (issue 38): the launch carries them,
each answers under its name before READY, vLLM refusing an optional one at start relaunches
without it (its error in the log), /status and the status CLI name each adapter's state."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

from tests.support import (
    PYTHON,
    TIMEOUT_SCALE,
    Daemon,
    base_config,
    completion,
    free_port,
    merge,
    wait_until,
)
from tests.support.tinylora import make


def test_optional_adapter_vllm_refuses_at_start_is_left_out_and_reported(
        tmp_path: Path) -> None:
    good, bad = make(tmp_path / "good"), make(tmp_path / "bad")
    data = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**data, "bias": "all"}))
    port, status_port = free_port(), free_port()
    cfg = merge(base_config(port, status_port), {
        "adapters": [{"name": "sql", "path": str(good)},
                     {"name": "chat", "path": str(bad), "required": False}]})
    d = Daemon(tmp_path, cfg).start()
    try:
        d.wait_ready(60)
        [refused] = d.named("lora.start_refused")
        assert refused["left_out"] == ["chat"]
        assert "Adapter bias is not supported." in refused["error"]
        launches = d.named("lora.launch")
        assert [x["adapters"] for x in launches] == [["sql", "chat"], ["sql"]]
        assert completion(port, model="sql")[0] == 200
        assert completion(port, model="chat")[0] == 404
        code, raw = d.http_get("/status", timeout=5 * TIMEOUT_SCALE)
        assert code == 200
        doc = json.loads(raw)
        rows = {r["name"]: r for r in doc["adapters"]["managed"]}
        assert rows["sql"]["state"] in ("loaded", "unknown") and rows["chat"]["state"] == \
            "failed" and "lora.start_refused" in rows["chat"]["error"], rows
        shown = subprocess.run([PYTHON, "-m", "vllmwatch", "status", "--url",
                                f"http://127.0.0.1:{status_port}"], capture_output=True,
                               text=True, timeout=30 * TIMEOUT_SCALE)
        assert "adapter sql" in shown.stdout and "adapter chat" in shown.stdout and \
            "failed (not required): left out" in shown.stdout, shown.stdout + shown.stderr
    finally:
        d.stop()
        d.close()


def test_a_left_out_adapter_fixed_in_place_comes_back_live_with_one_load(
        tmp_path: Path) -> None:
    """The log says "fix it, then systemctl reload vllmwatch": with live changes on, the
    reload brings the left-out adapter back without a restart, loaded once (the core's change
    and the watch's retry both loaded it; vLLM's "already been loaded" left it failed)."""
    good, bad = make(tmp_path / "good"), make(tmp_path / "bad")
    fixed = (bad / "adapter_config.json").read_text()
    (bad / "adapter_config.json").write_text(json.dumps({**json.loads(fixed), "bias": "all"}))
    port, status_port = free_port(), free_port()
    cfg = merge(base_config(port, status_port), {
        "lora": {"live": True, "max_loras": 4},
        "adapters": [{"name": "sql", "path": str(good)},
                     {"name": "chat", "path": str(bad), "required": False}]})
    d = Daemon(tmp_path, cfg).start()
    try:
        d.wait_ready(60)
        assert completion(port, model="chat")[0] == 404
        (bad / "adapter_config.json").write_text(fixed)
        mark = d.mark()
        d.signal(signal.SIGHUP)
        d.wait_event("lora.loaded", 60, since=mark, adapter="chat")
        assert completion(port, model="chat")[0] == 200

        def rows() -> dict[str, Any] | None:
            doc = json.loads(d.http_get("/status", timeout=5 * TIMEOUT_SCALE)[1])["adapters"]
            states = {r["name"]: r["state"] for r in doc["managed"]}
            return doc if states["chat"] == "loaded" else None

        doc = wait_until(rows, 30 * TIMEOUT_SCALE, "chat shown loaded in /status")
        assert doc["loads_failed"] == 0 and d.named("lora.load_failed", since=mark) == []
        assert len(d.named("child.started")) == 2  # the refused start and its relaunch only
    finally:
        d.stop()
        d.close()


def test_an_embedding_models_adapters_are_checked_on_its_own_route(tmp_path: Path) -> None:
    """An adapter's check before READY was a completion under its name whatever the model:
    a pooling model (`--runner pooling`, an embedding model with LoRA adapters, which vLLM
    0.32 serves) has no /v1/completions, so every adapter's check answered 404 Not Found and
    each start ended at startup.timeout, READY never came. The check asks the route the
    canary found the model answers (here /v1/embeddings)."""
    port = free_port()
    cfg = merge(base_config(port, free_port()), {
        "startup": {"timeout": "60s"}, "adapters": [{"name": "emb", "path": str(
            make(tmp_path / "emb"))}]})
    cfg["vllm"]["args"] = {"runner": "pooling"}
    d = Daemon(tmp_path, cfg).start()
    try:
        d.wait_ready(60)
        [passed] = d.named("smoke.passed")
        assert (passed["check"], passed["path"], passed["model"]) == \
            ("adapter:emb", "/v1/embeddings", "emb")
        assert not d.named("smoke.failed") and not d.named("restart.begin")
    finally:
        d.close()
