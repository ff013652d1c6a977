"""Incident records under the booted systemd with the shipped unit and .deb (issue 25).

A deadlocked (not stopped) fake engine is a hang: the record is written by the service user
under StateDirectory= (/var/lib/vllmwatch/incidents), 0700, with the engine's stacks — by
faulthandler through the startup hook (no ptrace, no capability), and by py-spy where the
unit allows it (this host has no Yama; the hook names vllmwatch as ptracer for
ptrace_scope=1, see docs/operations/incidents.md). The journal entry names the record.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.systemd.conftest import Boot, dropin, fake_config

pytestmark = pytest.mark.systemd

PORT, STATUS = 18000, 19101
CONF = "/etc/vllmwatch/vllmwatch.toml"
FAST = "vllmwatch.service.d/test.conf"
ROOT = "/var/lib/vllmwatch/incidents"


def _yama() -> int:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as fh:
            return int(fh.read())
    except OSError:
        return 0


def write(path: str, text: str) -> str:
    return f"mkdir -p {os.path.dirname(path)}\ncat > {path} <<'VWEOF'\n{text}\nVWEOF\n"


def test_a_deadlocked_engine_writes_an_incident_with_stacks_as_the_service_user(
        boot: Boot) -> None:
    config = fake_config(PORT, STATUS, extra_args={"deadlock-after": 2},
                         extra='[incidents]\ntimeout = "3s"\n').replace(
        'canary_interval = "3s"\ncanary_timeout = "5s"',
        'canary_interval = "1s"\ncanary_timeout = "2s"')
    r = boot(write(CONF, config) + f"""
systemctl start vllmwatch
wait_for 90 sh -c 'journalctl -u vllmwatch -o json --no-pager | grep -q incident.recorded'
journalctl -u vllmwatch -o json --no-pager | grep incident.recorded | head -1 > entry.json
id=$(ls {ROOT} | grep -- -hang | head -1)
echo "$id" > id.txt
stat -c '%U %a' {ROOT} > root_mode.txt
stat -c '%U %a' "{ROOT}/$id" "{ROOT}/$id/record.json" > rec_mode.txt
cp "{ROOT}/$id/record.json" record.json
/opt/vllmwatch/bin/vllmwatch incidents > list.txt 2>&1
/opt/vllmwatch/bin/vllmwatch incidents show "$id" > show.txt 2>&1
test -x /opt/vllmwatch/venv/bin/py-spy; echo $? > pyspy_shipped.txt
systemctl stop vllmwatch
""", units={FAST: dropin(RestartSec="1s")}, timeout=180)
    assert r.returncode == 0, r.explain()
    entry = json.loads(r.read("entry.json"))
    rid = r.read("id.txt").strip()
    assert entry["VLLMWATCH_INCIDENT"] == rid and entry["VLLMWATCH_REASON"] == "hang"
    assert r.read("root_mode.txt").split() == ["vllmwatch", "700"]
    assert [ln.split() for ln in r.read("rec_mode.txt").splitlines()] == \
        [["vllmwatch", "700"], ["vllmwatch", "600"]]
    rec = json.loads(r.read("record.json"))
    engine = [p for p in rec["stacks"]["processes"] if p["role"] == "engine_core"]
    assert engine, rec["stacks"]
    dumps = {d["method"]: d for d in engine[0]["dumps"]}
    fh = dumps["faulthandler"]
    assert fh["ok"], fh
    assert any(f[0] == "engine_deadlock" for t in fh["threads"] for f in t["frames"]), fh
    # py-spy under the hardened unit: same user, process_vm_readv is in @system-service.
    assert r.read("pyspy_shipped.txt").strip() == "0"
    # Yama 0 or 1 (the hook's PR_SET_PTRACER) allows it; 2 and 3 need CAP_SYS_PTRACE.
    spy = dumps["py-spy"]
    assert spy["ok"] or (_yama() >= 2 and "ptrace" in spy["error"]), spy
    assert rid in r.read("list.txt"), r.read("list.txt")
    assert "== what each vLLM thread" in r.read("show.txt")
