"""A cache directory another local user can write into is no place for vLLM's caches: vLLM
loads what it finds there as code (Inductor's compiled graphs are Python modules, the AOT
artifact and Triton's kernels are loaded as they are), so a planted entry runs as the
service. A cache root (or a cache under it) writable by every user, or owned by another user
(pre-created in /tmp by someone else), is left out like an unwritable one: vLLM keeps its
default location, `prewarm.cache_unusable` says why."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.shell.test_prewarm import NO_GPU, Events, make_config, step
from vllmwatch.prewarm import runner as prewarm


def test_a_world_writable_cache_root_is_left_out(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    root.chmod(0o777)  # what `chmod 777` on a shared disk does
    usable, problems = prewarm.make_cache_dirs(make_config(tmp_path, cache_dir=str(root)), {})
    assert usable == {}
    assert {var for var, _, _ in problems} == set(prewarm.CACHE_VARS)
    assert all("every user" in why for _, _, why in problems)
    assert prewarm.cannot_make(str(root / "vllm")) is not None  # print-command agrees


def test_a_world_writable_cache_under_a_good_root_is_left_out_alone(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    (root / "triton").mkdir(parents=True)
    (root / "triton").chmod(0o777)
    usable, problems = prewarm.make_cache_dirs(make_config(tmp_path, cache_dir=str(root)), {})
    assert [var for var, _, _ in problems] == ["TRITON_CACHE_DIR"]
    assert set(usable) == set(prewarm.CACHE_VARS) - {"TRITON_CACHE_DIR"}


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_cache_another_user_created_first_is_left_out(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    (root / "vllm").mkdir(parents=True)
    os.chown(root / "vllm", 4242, 4242)  # pre-created by another user (0755: root may
    # still write into it, and its owner may replace what is there)
    _, problems = prewarm.make_cache_dirs(make_config(tmp_path, cache_dir=str(root)), {})
    assert [var for var, _, _ in problems] == ["VLLM_CACHE_ROOT"]


def test_a_sticky_shared_parent_and_a_private_cache_are_fine(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: others cannot touch what is ours inside
    config = make_config(tmp_path, cache_dir=str(shared / "cache"))
    usable, problems = prewarm.make_cache_dirs(config, {})
    assert not problems and set(usable) == set(prewarm.CACHE_VARS)
    report = prewarm.run(config, Events(), {"HOME": str(tmp_path)}, NO_GPU)
    assert step(report, "caches").status == "ok"
