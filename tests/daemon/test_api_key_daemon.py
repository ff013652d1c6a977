"""The real daemon over the fake vLLM (which enforces --api-key / VLLM_API_KEY as vLLM does)
with the key in [vllm.env] or in vllm.env_file: vLLM required the key, the probes, canary and
smoke check sent none (only vllm.api_key_file's was read), every canary got 401 and vLLM was
never READY. Now the same key is sent and it is READY."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import Daemon, base_config, free_port, merge

KEY = "k3yElsewhere0123"


@pytest.mark.parametrize("where", ["vllm.env", "env_file"])
def test_ready_with_the_key_outside_the_key_file(tmp_path: Path, where: str) -> None:
    if where == "vllm.env":
        vllm: dict[str, Any] = {"env": {"VLLM_API_KEY": KEY}}
    else:
        env_file = tmp_path / "vllm.env"
        env_file.write_text(f"VLLM_API_KEY={KEY}\n")
        env_file.chmod(0o600)
        vllm = {"env_file": str(env_file)}
    cfg: dict[str, Any] = merge(base_config(free_port(), free_port()),
                                {"vllm": vllm, "startup": {"timeout": "60s"}})
    cfg["smoke"] = [{"endpoint": "chat"}]  # the smoke check sends the key too
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", cfg).start()
    try:
        d.wait_ready(60.0)
        assert d.named("smoke.passed") and not d.named("smoke.failed")
        assert not d.named("probe.failed"), d.dump()
    finally:
        d.close()
