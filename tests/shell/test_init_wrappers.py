"""init and the programs a hand-run line ran vLLM under (`sudo -u`, `numactl`, `taskset`,
`nice`, `ionice`, `chrt`): the service cannot keep them, so init names the unit directive
that says the same, and the vLLM line itself is read as if they were not there."""

from __future__ import annotations

import pytest

from tests.shell.test_init_migration import toml_of
from vllmwatch.config import serveline
from vllmwatch.migrate import wrapwords

SERVE = ["vllm", "serve", "/m", "--max-model-len", "4096"]


@pytest.mark.parametrize(("wrapper", "said"), [
    ("sudo -u alice", ["as 'alice'", "User=alice"]),
    ("sudo -ualice", ["as 'alice'", "User=alice"]),
    ("sudo --user alice", ["as 'alice'", "User=alice"]),
    ("sudo --user=alice -g gpu", ["User=alice", "Group=gpu or SupplementaryGroups=gpu"]),
    ("sudo -E -H -u alice", ["User=alice"]),
    ("sudo", ["as 'root'", "vLLM needs no root"]),
    ("numactl -N 0 -m 0", ["NUMAPolicy=bind, NUMAMask=0", "NUMA node(s) 0"]),
    ("numactl --cpunodebind 1 --membind 1", ["NUMAMask=1", "NUMA node(s) 1"]),
    ("numactl --interleave=all", ["NUMAPolicy=interleave, NUMAMask=all"]),
    ("numactl -C 0-7,16", ["CPUAffinity=0-7 16"]),
    ("taskset -c 0-7,16", ["CPUAffinity=0-7 16"]),
    ("taskset 0xf0", ["CPUAffinity=4-7"]),
    ("taskset 5", ["CPUAffinity=0 2"]),
    ("nice -n 5", ["Nice=5"]),
    ("nice -5", ["Nice=5"]),
    ("nice", ["Nice=10"]),
    ("ionice -c 3", ["IOSchedulingClass=idle"]),
    ("ionice -c2 -n7", ["IOSchedulingClass=best-effort and IOSchedulingPriority=7"]),
    ("chrt -f 50", ["CPUSchedulingPolicy=fifo and CPUSchedulingPriority=50"]),
    ("sudo -u alice numactl -N 0 nice -n 5", ["User=alice", "NUMA node(s) 0", "Nice=5"]),
])
def test_each_wrapper_becomes_the_unit_directive_and_the_line_is_read_without_it(
        wrapper: str, said: list[str]) -> None:
    words = [*wrapper.split(), *SERVE]
    line = serveline.parse(words)
    assert line.command == ["vllm", "serve"] and line.rest == SERVE[2:], line
    assert [w for ws in line.wrappers for w in ws] == wrapper.split()
    todo = " | ".join(wrapwords.todo(line.wrappers))
    for part in said:
        assert part in todo, todo
    assert all("sudo systemctl edit vllmwatch" in t or "needs no root" in t
               for t in wrapwords.todo(line.wrappers))
    # the whole path: the config loads, with the line's flags and the to-do beside it
    data, draft = toml_of(" ".join(words))
    assert data["vllm"]["args"]["max-model-len"] == 4096
    mine = [t for t in draft.todo if t.startswith("the line ran vLLM")]
    assert mine == wrapwords.todo(line.wrappers)


@pytest.mark.parametrize("wrapper", ["nohup", "setsid", "time -f %e", "stdbuf -oL",
                                     "env -u FOO", "exec -a vllm-main"])
def test_wrappers_that_mean_nothing_under_systemd_go_without_a_word(wrapper: str) -> None:
    line = serveline.parse([*wrapper.split(), *SERVE])
    assert line.command == ["vllm", "serve"] and line.rest == SERVE[2:]
    assert wrapwords.todo(line.wrappers) == []


@pytest.mark.parametrize(("mask", "cpus"), [("1", "0"), ("0x3", "0-1"), ("ff00", "8-15"),
                                            ("0x5", "0 2"), ("0", None), ("zz", None)])
def test_a_taskset_mask_is_read_as_the_cpu_list_it_means(mask: str, cpus: str | None) -> None:
    assert wrapwords.cpu_list(mask) == cpus
