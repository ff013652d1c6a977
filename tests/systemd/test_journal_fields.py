"""Events are journal entries with fields under a real systemd 252: query them by field and id.

Root and systemd-nspawn are needed; without them the test skips with the reason.
"""

from __future__ import annotations

import json

import pytest

from tests.systemd.conftest import ARMED_EXIT, Boot, dropin, fake_config
from tests.systemd.test_in_systemd import CONF, FAST, PORT, STATUS, ok, write
from vllmwatch.shell.journal import MESSAGE_IDS

pytestmark = pytest.mark.systemd


def _entries(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_events_are_queryable_by_field_and_message_id(boot: Boot) -> None:
    begin_id = MESSAGE_IDS["restart.begin"]
    ready_id = MESSAGE_IDS["child.ready"]
    r = boot(write(CONF, fake_config(PORT, STATUS, extra_args=ARMED_EXIT)) + f"""
systemctl start vllmwatch
wait_for 60 sh -c 'journalctl -u vllmwatch VLLMWATCH_EVENT=child.ready -o cat | grep -q .'
touch /run/vllmwatch-faults.arm  # --exit-after counts from here: after READY, on any box
wait_for 60 sh -c 'journalctl -u vllmwatch VLLMWATCH_EVENT=restart.begin -o cat | grep -q .'
journalctl -u vllmwatch VLLMWATCH_EVENT=restart.begin -o json --no-pager > begin.json
journalctl MESSAGE_ID={begin_id} -o json --no-pager > by-id.json
journalctl MESSAGE_ID={ready_id} -o json --no-pager > ready.json
journalctl -u vllmwatch VLLMWATCH_SOURCE=vllm VLLM_PROCESS=APIServer -o json --no-pager \
    > vllm.json
journalctl -t vllm -o json --no-pager > by-tag-vllm.json
journalctl -t vllmwatch -o json --no-pager > by-tag-vllmwatch.json
journalctl -u vllmwatch -t vllm --no-pager > short.txt
prop vllmwatch MainPID > mainpid.txt
journalctl -u vllmwatch VLLMWATCH_EVENT=child.started -o json --no-pager > started.json
systemctl stop vllmwatch
""", units={FAST: dropin(RestartSec="1s")})
    ok(r)
    begin = _entries(r.read("begin.json"))
    assert begin, r.explain()
    first = begin[0]
    assert first["_SYSTEMD_UNIT"] == "vllmwatch.service"
    assert first["MESSAGE_ID"] == begin_id
    assert first["PRIORITY"] == "4"
    assert first["SYSLOG_IDENTIFIER"] == "vllmwatch"
    assert first["VLLMWATCH_REASON"]
    assert str(first["MESSAGE"]).startswith("restart.begin ")
    by_id = _entries(r.read("by-id.json"))
    assert [e["__CURSOR"] for e in by_id] == [e["__CURSOR"] for e in begin]
    assert all(e["VLLMWATCH_EVENT"] == "child.ready" for e in _entries(r.read("ready.json")))
    assert _entries(r.read("ready.json")), r.explain()
    lines = _entries(r.read("vllm.json"))
    assert lines, r.explain()
    # vLLM's lines: their own identifier, the text once, the launched pid as VLLM_MAIN_PID.
    assert all(str(e["MESSAGE"]).startswith("(APIServer pid=") for e in lines)
    by_tag = _entries(r.read("by-tag-vllm.json"))
    # (read after vllm.json while the relaunched vLLM still logs: the same lines, and maybe
    # later ones; a loaded CI box gave two more)
    tagged = [e["__CURSOR"] for e in by_tag if e.get("VLLM_PROCESS") == "APIServer"]
    assert tagged[:len(lines)] == [e["__CURSOR"] for e in lines]
    main_pid = r.read("mainpid.txt").strip()
    started = {str(e["VLLMWATCH_PID"]) for e in _entries(r.read("started.json"))}
    assert started and main_pid not in started, r.explain()
    for e in by_tag:
        assert e["SYSLOG_IDENTIFIER"] == "vllm" and e["VLLMWATCH_SOURCE"] == "vllm"
        assert e["_SYSTEMD_UNIT"] == "vllmwatch.service"
        assert "VLLMWATCH_TEXT" not in e and "VLLMWATCH_PID" not in e
        assert e["_PID"] == main_pid  # journald's _PID is vllmwatch's own
    assert {e["VLLM_MAIN_PID"] for e in by_tag} <= started  # a launched child's pid
    # `-t vllmwatch`: vllmwatch's events (and ExecStartPre's check output), no vLLM line.
    ours = _entries(r.read("by-tag-vllmwatch.json"))
    assert {e.get("VLLMWATCH_SOURCE") for e in ours} == {"vllmwatch", None}, r.explain()
    assert "vllm[" in r.read("short.txt") and "vllm| " not in r.read("short.txt")
