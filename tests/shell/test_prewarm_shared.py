"""A cache directory another local user can write into is no place for vLLM's caches: vLLM
loads what it finds there as code (Inductor's compiled graphs are Python modules, the AOT
artifact and Triton's kernels are loaded as they are), so a planted entry runs as the
service. A cache root (or a cache under it, or a folder in one that vLLM loads code from)
writable by every user, or by a group with members other than us (sshd's StrictModes), or
owned by another user (pre-created in /tmp by someone else), is not used: the compiled-code
caches go to a folder of this service's own under its private state directory instead
(vLLM's default may be that very root: the shipped unit's XDG_CACHE_HOME), HF_HOME is left
out (a new one would download the model again); `prewarm.cache_unusable` says why and where;
`check` warns, and `vllmwatch prewarm`'s kernel warm-up does not use it either."""

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
    state = tmp_path / "state"
    usable, problems = prewarm.make_cache_dirs(make_config(tmp_path, cache_dir=str(root)),
                                               {"STATE_DIRECTORY": str(state)})
    code = set(prewarm.CACHE_VARS) - {"HF_HOME"}
    assert usable == {var: str(state / "private-cache" / prewarm.CACHE_VARS[var])
                      for var in code}  # never under the refused root
    for path in usable.values():
        assert os.stat(path).st_mode & 0o777 == 0o700 and safefile.shared_dir(path) is None
    assert {var for var, _, _ in problems} == set(prewarm.CACHE_VARS)
    assert all("every user" in why for _, _, why in problems)
    assert all(f"using {usable[var]}" in why for var, _, why in problems if var in code)
    assert prewarm.cannot_make(str(root / "vllm")) is not None  # print-command agrees


def test_with_no_private_place_a_shared_cache_is_left_out(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    root.chmod(0o777)
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)  # not ours alone: no private cache can be had under it
    usable, problems = prewarm.make_cache_dirs(make_config(tmp_path, cache_dir=str(root)),
                                               {"STATE_DIRECTORY": str(state)})
    assert usable == {} and {var for var, _, _ in problems} == set(prewarm.CACHE_VARS)
    assert not (state / "private-cache").exists()


def test_a_world_writable_cache_under_a_good_root_is_left_out_alone(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    (root / "triton").mkdir(parents=True)
    (root / "triton").chmod(0o777)
    state = tmp_path / "state"
    usable, problems = prewarm.make_cache_dirs(make_config(tmp_path, cache_dir=str(root)),
                                               {"STATE_DIRECTORY": str(state)})
    assert [var for var, _, _ in problems] == ["TRITON_CACHE_DIR"]
    assert usable["TRITON_CACHE_DIR"] == str(state / "private-cache" / "triton")
    assert all(usable[var].startswith(str(root)) for var in usable if var != "TRITON_CACHE_DIR")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_cache_another_user_created_first_is_left_out(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    (root / "vllm").mkdir(parents=True)
    os.chown(root / "vllm", 4242, 4242)  # pre-created by another user (0755: root may
    # still write into it, and its owner may replace what is there)
    _, problems = prewarm.make_cache_dirs(make_config(tmp_path, cache_dir=str(root)),
                                          {"STATE_DIRECTORY": str(tmp_path / "s")})
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
    usable, problems = prewarm.make_cache_dirs(config, {"STATE_DIRECTORY": str(tmp_path / "s")})
    assert not any(path.startswith(str(root)) for path in usable.values())
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
    usable, problems = prewarm.make_cache_dirs(make_config(tmp_path, cache_dir=str(root)),
                                               {"STATE_DIRECTORY": str(tmp_path / "s")})
    assert [var for var, _, _ in problems] == ["VLLM_CACHE_ROOT"]
    assert str(aot) in problems[0][2]
    assert usable["VLLM_CACHE_ROOT"] == str(tmp_path / "s" / "private-cache" / "vllm")
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
    prewarm.run(config, Events(), {"HOME": str(tmp_path), "STATE_DIRECTORY": str(tmp_path / "s")},
                hooks)
    env = json.loads(seen.read_text())
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "s" / "private-cache" / "triton")  # ours
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
    state = tmp_path / "state"
    state.mkdir(mode=0o777)
    state.chmod(0o777)  # no private place for a cache of our own: left out
    usable, problems = prewarm.make_cache_dirs(make_config(tmp_path, cache_dir=str(root)),
                                               {**environ, "STATE_DIRECTORY": str(state)})
    why = {var: text for var, _, text in problems}
    for var, sub in (("VLLM_CACHE_ROOT", "vllm"), ("HF_HOME", "huggingface")):
        assert f"its default without {var}, {root / sub}, is under the same {root}" in why[var]
    assert "its default without" not in why["TRITON_CACHE_DIR"]  # $HOME/.triton: elsewhere
    assert usable == {}
    state.chmod(0o755)  # a private place: the compiled-code caches go there, never the root
    usable, problems = prewarm.make_cache_dirs(make_config(tmp_path, cache_dir=str(root)),
                                               {**environ, "STATE_DIRECTORY": str(state)})
    assert usable["VLLM_CACHE_ROOT"] == str(state / "private-cache" / "vllm")
    assert "HF_HOME" not in usable and "its default without HF_HOME" in dict(
        (var, text) for var, _, text in problems)["HF_HOME"]


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


def test_a_refused_cache_goes_to_disk_not_the_runtime_tmpfs(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside systemd, root's state rule falls back to /run/vllmwatch (a tmpfs, like a
    user's $XDG_RUNTIME_DIR): compiled code there takes RAM and is gone at each reboot."""
    root = tmp_path / "cache"
    (root / "triton").mkdir(parents=True)
    (root / "triton").chmod(0o777)
    lasting = tmp_path / "lib"
    monkeypatch.setattr(safefile, "LASTING_ROOT_STATE", str(lasting))
    monkeypatch.setattr(safefile.os, "geteuid", lambda: 0)  # as root by hand, no unit
    environ = {"RUNTIME_DIRECTORY": str(tmp_path / "run"), "HOME": str(tmp_path / "home")}
    assert safefile.lasting_state_candidate(environ) == str(lasting)
    monkeypatch.undo()
    monkeypatch.setattr(safefile, "LASTING_ROOT_STATE", str(lasting))
    if os.geteuid() == 0:
        usable, _ = prewarm.make_cache_dirs(make_config(tmp_path, cache_dir=str(root)), environ)
        assert usable["TRITON_CACHE_DIR"] == str(lasting / "private-cache" / "triton")
    monkeypatch.setattr(safefile.os, "geteuid", lambda: 1000)  # a user: its state, not runtime
    got = safefile.lasting_state_candidate({"XDG_RUNTIME_DIR": str(tmp_path / "run"),
                                            "HOME": str(tmp_path / "home")})
    assert got == str(tmp_path / "home" / ".local" / "state" / "vllmwatch")
    assert safefile.lasting_state_candidate({"STATE_DIRECTORY": "/var/lib/x:/y"}) == "/var/lib/x"
