"""`vllmwatch prewarm` run as root into a cache another user owns (`sudo vllmwatch prewarm`
beside the unit's User=vllmwatch and CacheDirectory=): whatever root creates there stays
root's (0700 directories), and the service can then neither read nor write its own cache.
The steps that write (caches, kernels) refuse and say how to run it; reading the weights
into the page cache is harmless as root and still runs.

As root the cache is chowned to another uid; otherwise the effective uid reads as 0 and the
test's own (non-root) directory is the other user's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.shell.test_prewarm import NO_GPU, Events, make_config, step, write_files
from vllmwatch.prewarm import runner as prewarm

OTHER = 4242  # the service user's uid, as root sees it


def _theirs(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path.mkdir()
    if os.geteuid() == 0:
        os.chown(path, OTHER, OTHER)
    else:
        monkeypatch.setattr(os, "geteuid", lambda: 0)


def _root_owned(top: Path) -> list[str]:
    return [str(p) for p in top.rglob("*") if p.lstat().st_uid == 0]


def test_root_leaves_nothing_of_its_own_in_another_users_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    _theirs(cache, monkeypatch)
    write_files(tmp_path / "model", 1, 1 << 20)
    config = make_config(tmp_path / "model", cache_dir=str(cache), kernels=True,
                         page_cache_max_fraction=0.9)
    events = Events()
    report = prewarm.run(config, events, {"HOME": str(tmp_path)},
                         prewarm.Hooks(gpu_count=lambda: 1, python="/nonexistent/python"))
    if os.geteuid() == 0:
        assert _root_owned(cache) == []
    assert list(cache.iterdir()) == []  # nothing created as root
    for name in ("caches", "kernels"):
        got = step(report, name)
        assert got.status == "warn" and "sudo -u" in got.detail and str(cache) in got.detail
    assert step(report, "page_cache").status in ("ok", "skipped")  # reading is harmless
    assert report.ok  # a warning, not a failure, unless prewarm.required


def test_a_required_prewarm_fails_as_root_in_another_users_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    _theirs(cache, monkeypatch)
    config = make_config(tmp_path / "none", cache_dir=str(cache), required=True)
    report = prewarm.run(config, Events(), {"HOME": str(tmp_path)}, NO_GPU)
    assert not report.ok and step(report, "caches").status == "failed"


def test_root_in_its_own_cache_and_a_user_in_theirs_write_as_before(
        tmp_path: Path) -> None:
    cache = tmp_path / "cache"  # owned by whoever runs the test: the same user
    config = make_config(tmp_path / "none", cache_dir=str(cache))
    report = prewarm.run(config, Events(), {"HOME": str(tmp_path)}, NO_GPU)
    assert step(report, "caches").status == "ok"
    assert (cache / "vllm").is_dir()


def test_another_users_hub_cache_is_only_read_and_refuses_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_HOME set to a user's own hub cache (weights are read from it, never written by
    prewarm): root's caches under a root-owned cache_dir are made as before."""
    hub = tmp_path / "hub"
    if os.geteuid() == 0:
        hub.mkdir()
        os.chown(hub, OTHER, OTHER)
    config = make_config(tmp_path / "none", cache_dir=str(tmp_path / "cache"))
    report = prewarm.run(config, Events(), {"HOME": str(tmp_path), "HF_HOME": str(hub)}, NO_GPU)
    assert step(report, "caches").status == "ok"
