"""The journald catalog under a real systemd 252: the package installs it, `journalctl -x`
explains vllmwatch's events with it, and a purge takes it away again.

Root and systemd-nspawn are needed; without them the test skips with the reason.
"""

from __future__ import annotations

import pytest

from tests.systemd.conftest import Boot, fake_config
from tests.systemd.test_in_systemd import CONF, PORT, STATUS, ok, write
from vllmwatch.shell.journal import MESSAGE_IDS

pytestmark = pytest.mark.systemd


def test_journalctl_x_explains_vllmwatch_events(boot: Boot) -> None:
    ready, start = MESSAGE_IDS["child.ready"], MESSAGE_IDS["daemon.start"]
    r = boot(write(CONF, fake_config(PORT, STATUS)) + f"""
journalctl --list-catalog > installed.txt  # postinst compiled it
journalctl --update-catalog; echo $? > update.rc
journalctl --list-catalog > listed.txt
systemctl start vllmwatch
wait_for 60 sh -c 'journalctl -u vllmwatch MESSAGE_ID={ready} -o cat | grep -q .'
journalctl -x -u vllmwatch MESSAGE_ID={ready} --no-pager > ready-x.txt
journalctl -x -u vllmwatch MESSAGE_ID={start} --no-pager > start-x.txt
journalctl -u vllmwatch MESSAGE_ID={ready} --no-pager > ready-plain.txt
systemctl stop vllmwatch
# an instance config of the admin's and the key `vllmwatch init` wrote (the purge keeps the
# first, and says so; the key goes)
echo '[vllm]' > /etc/vllmwatch/mine.toml
(umask 077; echo sk-init-made > /etc/vllmwatch/api-key)
dpkg --purge vllmwatch > purge.log 2>&1
journalctl --list-catalog > after-purge.txt
ls -A /etc/vllmwatch > etc-after-purge.txt
""")
    ok(r)
    assert r.read("update.rc").strip() == "0"
    for name in ("installed.txt", "listed.txt"):
        listed = r.read(name)
        missing = [event for event, mid in MESSAGE_IDS.items() if mid not in listed]
        assert missing == [], (name, missing, r.explain())
    shown = r.read("ready-x.txt")
    # -x adds the entry under the line, with the entry's fields filled in.
    assert "Subject: vLLM serves: it answered its first completion" in shown, shown
    assert "answered a real completion" in shown and "@VLLMWATCH_" not in shown, shown
    assert "Subject:" not in r.read("ready-plain.txt")
    assert f"config {CONF}" in r.read("start-x.txt"), r.read("start-x.txt")
    assert not [mid for mid in MESSAGE_IDS.values() if mid in r.read("after-purge.txt")]
    assert r.read("etc-after-purge.txt").split() == ["mine.toml"]
    assert ("vllmwatch: /etc/vllmwatch kept: it holds files the package did not install: "
            "mine.toml") in r.read("purge.log")
