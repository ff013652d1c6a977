"""A cache directory another local user can write into is no place for vLLM's caches: vLLM
loads what it finds there as code (Inductor's compiled graphs are Python modules, the AOT
artifact and Triton's kernels are loaded as they are), so a planted entry runs as the
service. A cache root (or a cache under it, or a folder in one that vLLM loads code from)
writable by every user, or by a group with members other than us (sshd's StrictModes), or
owned by another user (pre-created in /tmp by someone else), is left out like an unwritable
one: vLLM keeps its default location, `prewarm.cache_unusable` says why; `check` warns, and
`vllmwatch prewarm`'s kernel warm-up does not use it either."""

from __future__ import annotations

import json
import os
import pwd
import sys
from pathlib import Path

import pytest

from tests.shell.test_prewarm import NO_GPU, Events, make_config, step
from vllmwatch.check import host
from vllmwatch.check.base import WARN, Context
from vllmwatch.config import safefile
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


def _other_members_gid() -> int:
    """A group with a member other than us (by primary group): its write bit lets them in."""
    me = os.geteuid()
    return next(p.pw_gid for p in pwd.getpwall() if p.pw_uid != me and p.pw_gid != 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="chgrp to a group we are not in needs root")
def test_a_cache_root_writable_by_a_group_others_are_in_is_left_out(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    gid = _other_members_gid()
    os.chown(root, os.geteuid(), gid)
    root.chmod(0o770)  # `chmod g+w` for a team's group on a shared disk
    config = make_config(tmp_path, cache_dir=str(root))
    usable, problems = prewarm.make_cache_dirs(config, {})
    assert usable == {}
    assert all("writable by group" in why and "chmod g-w" in why for _, _, why in problems)
    assert prewarm.cannot_make(str(root / "vllm"), "VLLM_CACHE_ROOT") is not None
    result = host.check_prewarm_cache(Context(config=config, env={}))  # `check` agrees
    assert result.status == WARN and "writable by group" in result.detail


@pytest.mark.skipif(os.geteuid() != 0, reason="chgrp to a group we are not in needs root")
def test_a_group_writable_folder_vllm_loads_code_from_is_left_out(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    aot = root / "vllm" / "torch_compile_cache" / "torch_aot_compile"
    aot.mkdir(parents=True)
    os.chown(aot, os.geteuid(), _other_members_gid())
    aot.chmod(0o770)
    _, problems = prewarm.make_cache_dirs(make_config(tmp_path, cache_dir=str(root)), {})
    assert [var for var, _, _ in problems] == ["VLLM_CACHE_ROOT"]
    assert str(aot) in problems[0][2]
    assert prewarm.cannot_make(str(root / "vllm"), "VLLM_CACHE_ROOT") is not None


def test_a_group_writable_cache_of_our_own_private_group_is_fine(tmp_path: Path) -> None:
    me = pwd.getpwuid(os.geteuid())
    if safefile.group_others(me.pw_gid) is not None:
        pytest.skip(f"our primary group {me.pw_gid} has other members here")
    root = tmp_path / "cache"
    root.mkdir()
    os.chown(root, os.geteuid(), me.pw_gid)
    root.chmod(0o770)  # umask 002 with user-private groups (Debian's useradd default)
    usable, problems = prewarm.make_cache_dirs(make_config(tmp_path, cache_dir=str(root)), {})
    assert not problems and set(usable) == set(prewarm.CACHE_VARS)


@pytest.mark.skipif(os.geteuid() != 0, reason="chgrp to a group we are not in needs root")
def test_the_kernel_warm_up_never_uses_a_cache_another_user_can_write(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    (root / "triton").mkdir(parents=True)
    os.chown(root / "triton", os.geteuid(), _other_members_gid())
    (root / "triton").chmod(0o770)
    seen = tmp_path / "env.json"
    script = f"import json, os; json.dump(dict(os.environ), open({str(seen)!r}, 'w'))"
    config = make_config(tmp_path, cache_dir=str(root), page_cache=False, kernels=True)
    hooks = prewarm.Hooks(gpu_count=lambda: 1, python=sys.executable, kernel_script=script)
    prewarm.run(config, Events(), {"HOME": str(tmp_path)}, hooks)
    env = json.loads(seen.read_text())
    assert "TRITON_CACHE_DIR" not in env  # Triton's default, as the daemon's launch
    assert env["VLLM_CACHE_ROOT"] == str(root / "vllm")


def test_leaving_a_cache_out_says_so_when_vllms_own_default_is_the_same_place(
        tmp_path: Path) -> None:
    """The shipped unit sets XDG_CACHE_HOME to the cache root: without VLLM_CACHE_ROOT (or
    HF_HOME) vLLM's own default is the very folder refused; the warning must not let
    "vLLM keeps its default cache location" read as safe there."""
    root = tmp_path / "cache"
    root.mkdir()
    root.chmod(0o777)
    environ = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(root)}
    _, problems = prewarm.make_cache_dirs(make_config(tmp_path, cache_dir=str(root)), environ)
    why = {var: text for var, _, text in problems}
    for var, sub in (("VLLM_CACHE_ROOT", "vllm"), ("HF_HOME", "huggingface")):
        assert f"its default without {var}, {root / sub}, is under the same {root}" in why[var]
    assert "its default without" not in why["TRITON_CACHE_DIR"]  # $HOME/.triton: elsewhere


def test_root_s_own_group_writable_folder_is_fine_and_a_memberless_group_is_not(
        tmp_path: Path) -> None:
    """root may write anywhere already: a group whose only members are us and root adds no
    writer; a group without members does (whoever is given it later)."""
    root_group = pwd.getpwuid(0).pw_gid
    if safefile.group_others(root_group) is not None:
        pytest.skip("root's group has other members here")
    assert safefile.group_others(root_group) is None
    import grp
    primary = {p.pw_gid for p in pwd.getpwall()}
    memberless = [g.gr_gid for g in grp.getgrall() if not g.gr_mem and g.gr_gid not in primary]
    if memberless:  # (most boxes have one: tty, disk, ...)
        assert "no members" in str(safefile.group_others(memberless[0]))
