"""`vllmwatch status` as a person reads it: where it serves, probe health, the start phase,
offsets that read as offsets, one memory vocabulary with STATUS=, and when nothing answers,
when and why it stopped (systemd's last exit, the last incident) and what to read next."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.support import TIMEOUT_SCALE
from vllmwatch.config.schema import from_dict
from vllmwatch.core import exitcodes
from vllmwatch.incident import cli as incident_cli
from vllmwatch.incident import latest, store
from vllmwatch.status import cli as status_cli
from vllmwatch.status import stopped
from vllmwatch.status.snapshot import MemoryFigures, Snapshot
from vllmwatch.status.statusline import serving_url, summary

NOW = 1.8e9


def _rows(text: str) -> dict[str, str]:
    return {line.split()[0]: line for line in text.splitlines() if line.strip()}


@pytest.mark.parametrize("section,url", [
    ({"vllm": {"model": "/m", "port": 8123}}, "http://127.0.0.1:8123"),
    ({"vllm": {"model": "/m", "host": "0.0.0.0", "port": 8000}}, "http://0.0.0.0:8000"),
    ({"vllm": {"model": "/m", "host": "::1", "port": 8000}}, "http://[::1]:8000"),
    ({"vllm": {"model": "/m", "port": 8001}, "gate": {"enabled": True, "listen": ":8000"}},
     "http://0.0.0.0:8000"),
])
def test_the_serving_url_is_where_clients_go(section: dict[str, Any], url: str) -> None:
    config = from_dict(section)
    assert serving_url(config.vllm, config) == url


def test_status_shows_where_it_serves_probe_health_and_offsets() -> None:
    doc = Snapshot(state="ready", ready=True, serving_url="http://0.0.0.0:8000",
                   model="qwen3-8b", start_phases_s={"load_start": 2.0, "weights": 94.0},
                   probe_last_completed={"health": NOW - 2, "canary": NOW - 12},
                   probe_failures={"health": 0, "canary": 3}).to_json()
    rows = _rows(status_cli.render(doc, now=NOW))
    assert rows["serving"].split(None, 1)[1] == "http://0.0.0.0:8000 model qwen3-8b"
    assert rows["startup"].endswith("load_start at +2s, weights at +1m34s")
    assert rows["probes"].endswith("last done canary 12s ago, health 2s ago; failed: canary 3")
    assert "phase" not in rows  # ready: no start phase


@pytest.mark.parametrize("phases,expected", [
    ({}, "launching vLLM (imports)"),
    ({"load_start": 1.5}, "loading the weights (since +1.5s)"),
    ({"load_start": 1.5, "weights": 94.0}, "finishing the model load (since +1m34s)"),
    ({"load_start": 1.5, "api_ready": 120.0}, "waiting for a first completion"),
    ({"something_new": 3.0}, "after something_new (since +3s)"),
])
def test_a_start_says_which_phase_it_is_in(phases: dict[str, float], expected: str) -> None:
    doc = Snapshot(state="starting", start_phases_s=phases).to_json()
    assert expected in _rows(status_cli.render(doc, now=NOW))["phase"]


def test_status_and_systemctl_status_name_memory_the_same_way() -> None:
    mem = MemoryFigures(gpu_tree_mib=35000.0, host_rss_mib=64.0, host_pss_mib=46.0)
    snap = Snapshot(state="ready", memory=mem)
    line = summary(snap)
    assert "gpu tree 34.2GiB" in line and "host pss 46MiB" in line
    cli = " ".join(status_cli.render(snap.to_json(), now=NOW).split())  # columns aside
    assert "host rss 64MiB, pss 46MiB" in cli and "gpu tree 34.2GiB" in cli
    rss_only = summary(Snapshot(memory=MemoryFigures(host_rss_mib=64.0)))
    assert "host rss 64MiB" in rss_only and "pss" not in rss_only


@pytest.mark.parametrize(("state", "phase", "reason", "exit_reason", "words", "row"), [
    # the first start's own rungs are no restart: STATUS= and `status` said "restart
    # launching" with restarts 0 (a crash loop it read as, at 3 a.m.)
    ("cleanup", "sweeping", None, None, "first start sweeping for 1s", "start"),
    ("starting", "launching", None, None, "first start launching for 1s", "start"),
    ("starting", "launching", "crash", None, "restart launching for 1s", "restart"),
    ("stopping", "terminating", None, "stop", "exit terminating for 1s", "exit"),
    ("stopping", "terminating", "hang", "gave_up", "exit terminating for 1s", "exit"),
])
def test_the_rung_is_said_as_what_the_climb_is(state: str, phase: str, reason: str | None,
                                               exit_reason: str | None, words: str,
                                               row: str) -> None:
    snap = Snapshot(state=state, restart_phase=phase, restart_phase_for_s=1.0,
                    restart_reason=reason, exit_reason=exit_reason)
    line = summary(snap)
    assert f"| {words} |" in line, line
    assert ("restart " in line) == (words.startswith("restart")), line
    rows = _rows(status_cli.render(snap.to_json(), now=NOW))
    assert rows[row].split(None, 1)[1].startswith(f"{phase} for 1s"), rows
    assert row == "restart" or "restart" not in rows
    doc = snap.to_json()
    del doc["restart_reason"]  # an older daemon's answer: its rung, as it was said
    assert "restart" in _rows(status_cli.render(doc, now=NOW)) or exit_reason


# --- not running ---------------------------------------------------------------------------

@pytest.mark.parametrize("path,unit", [
    ("/etc/vllmwatch/vllmwatch.toml", "vllmwatch.service"),
    ("/etc/vllmwatch/gpu0.toml", "vllmwatch@gpu0.service"),
    ("/home/me/vllmwatch.toml", "vllmwatch.service"),
    ("/etc/vllmwatch/sub/x.toml", "vllmwatch.service"),
])
def test_the_unit_follows_the_config(path: str, unit: str) -> None:
    assert stopped.unit_name(path) == unit


def _shown(stdout: str, code: int = 0) -> Any:
    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert kwargs["timeout"] <= stopped.SHOW_TIMEOUT_S
        assert cmd[:2] == ["systemctl", "show"] or cmd[:3] == ["systemctl", "--user", "show"]
        return subprocess.CompletedProcess(cmd, code, stdout, "")
    return run


FAILED = (f"LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code\n"
          f"ExecMainCode=1\nExecMainStatus={exitcodes.GAVE_UP}\n"
          "ExecMainExitTimestamp=Wed 2026-12-02 03:12:45 UTC\nNRestarts=4\n")


def test_systemd_view_is_guarded_and_bounded() -> None:
    view = stopped.systemd_view("vllmwatch.service", _shown(FAILED), booted=True)
    assert view is not None and view["ExecMainStatus"] == str(exitcodes.GAVE_UP)
    assert stopped.systemd_view("u", _shown(FAILED), booted=False) is None
    assert stopped.systemd_view("u", _shown(FAILED, code=1), booted=True) is None
    assert stopped.systemd_view("u", _shown("LoadState=not-found\n"), booted=True) is None

    def hangs(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])
    assert stopped.systemd_view("u", hangs, booted=True) is None
    odd = stopped.systemd_view("u", _shown("LoadState=loaded\nResult=" + "\x1b[2J" * 500
                                           + "\nJunk\n" * 10000), booted=True)
    assert odd is not None and len(odd["Result"]) <= 4 * stopped.MAX_VALUE
    assert "\x1b" not in odd["Result"]


@pytest.mark.parametrize("code,status,text", [
    ("1", str(exitcodes.GAVE_UP), f"exit {exitcodes.GAVE_UP} (crash-loop guard gave up)"),
    ("1", "0", "exit 0 (stopped on request)"),
    ("2", "9", "killed by SIGKILL"),
    ("3", "6", "killed by SIGABRT (core dumped)"),
    ("0", "0", ""),
    ("1", "", ""),
])
def test_last_exit_in_words(code: str, status: str, text: str) -> None:
    assert stopped.last_exit({"ExecMainCode": code, "ExecMainStatus": status}) == text


def _record(root: Path, reason: str, detail: str, wall: float) -> str:
    root.mkdir(parents=True, exist_ok=True)
    rid = store.record_id(wall, reason)
    return store.write(str(root), rid, {store.RECORD: json.dumps(
        {"reason": reason, "detail": detail, "time_utc": "2026-12-02T03:12:40Z"})})


def test_a_crash_loop_give_up_says_when_why_and_where_to_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    root = tmp_path / "incidents"
    _record(root, "crash", "old one", NOW - 3600)
    rid = _record(root, "crash", "EngineCore died (SIGKILL)", NOW)
    real = stopped.systemd_view
    monkeypatch.setattr(stopped, "systemd_booted", lambda: True)
    monkeypatch.setattr(stopped, "systemd_view",
                        lambda unit, booted=None: real(unit, _shown(FAILED), booted=booted))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    asked = []

    def find(unit: str) -> dict[str, Any] | None:
        asked.append(unit)
        return latest.newest([str(tmp_path / "no"), str(root)])
    code = status_cli.main("/etc/vllmwatch/vllmwatch.toml", f"127.0.0.1:{port}", False, find)
    assert asked == ["vllmwatch.service"]
    err = capsys.readouterr().err
    assert code == status_cli.EXIT_NOT_RUNNING
    rows = _rows(err)
    assert "vllmwatch.service: failed (failed), result exit-code" in rows["unit"]
    assert rows["stopped"].endswith(f"at Wed 2026-12-02 03:12:45 UTC, exit {exitcodes.GAVE_UP} "
                                    "(crash-loop guard gave up)")
    assert f"last: {rid} (crash: EngineCore died (SIGKILL))" in rows["incident"]
    assert f"vllmwatch incidents show {rid}" in err
    assert "journalctl -xeu vllmwatch" in rows["next"] and "reset-failed" in rows["next"]
    assert "Traceback" not in err


def test_without_systemd_or_records_it_still_says_how_to_start(tmp_path: Path) -> None:
    text = stopped.explain("http://127.0.0.1:1/status", "/etc/vllmwatch/gpu1.toml", None,
                           latest.newest([str(tmp_path), str(tmp_path / "missing")]))
    assert text.splitlines() == ["vllmwatch is not running (no answer at "
                                 "http://127.0.0.1:1/status)",
                                 "next      start it with `systemctl start vllmwatch@gpu1`"]


def test_where_no_systemd_runs_it_says_the_foreground_command(tmp_path: Path) -> None:
    """A container without systemd: `systemctl start` would start nothing there."""
    for path, shown in (("/etc/vllmwatch/gpu1.toml", "/etc/vllmwatch/gpu1.toml"),
                        ("/srv/my conf.toml", "'/srv/my conf.toml'")):
        text = stopped.explain("http://127.0.0.1:1/status", path, None, None, systemd=False)
        assert text.splitlines()[-1] == (
            "next      no systemd runs here: start it in the foreground with "
            f"`vllmwatch run --config {shown}` (or your container's entrypoint)")
        assert "systemctl" not in text


@pytest.mark.parametrize("closed", ["incidents", "state", "record"])
def test_a_records_folder_closed_to_the_caller_is_said_not_left_out(closed: str) -> None:
    """`vllmwatch status` as an operator who is not root nor the service user, the daemon
    down: the records (0700, in a state directory 0700) could not be listed, and the
    "incident last" line was left out as if there were none. It names the folder and what to
    do; as root the record itself is shown."""
    from tests.shell.test_hostile_cosmetics import _as_a_stranger

    top = Path(tempfile.mkdtemp(prefix="vw-records-", dir="/tmp"))  # (not tmp_path: 0700)
    try:
        top.chmod(0o755)
        state = top / "state"
        rid = _record(state / "incidents", "crash", "EngineCore died", NOW)
        for folder in (state, state / "incidents"):
            folder.chmod(0o755)  # as a umask 022 leaves them; then one is shut
        shut = {"state": state, "incidents": state / "incidents"}.get(
            closed, state / "incidents" / rid)  # "record": its own folder alone (0700)
        shut.chmod(0o700 if os.geteuid() == 0 else 0)
        roots = [str(state / "incidents"), str(top / "other" / "incidents")]

        def said() -> list[str]:
            return stopped.explain("http://127.0.0.1:1/status", "/etc/vllmwatch/vllmwatch.toml",
                                   None, latest.newest(roots)).splitlines()
        lines = _as_a_stranger(said)
        if os.geteuid() == 0:
            assert any(rid in line for line in said()), said()  # root reads it
    finally:
        for folder in (state, state / "incidents", state / "incidents" / rid):
            folder.chmod(0o700)
        shutil.rmtree(top)
    row = next((line for line in lines if line.startswith("incident")), "")
    where = str(shut) if closed == "record" else roots[0]
    assert f"cannot read {where} as this user" in row and "sudo vllmwatch status" in row, lines


def test_systemds_restarts_of_the_unit_are_not_called_vllms_restarts() -> None:
    """A crash-looped instance read `restarts  systemd restarted vllmwatch 4 times` stopped
    and `restarts 0` running: one word, two counts (vLLM's restarts, the unit's), and
    another unit's name. The unit's are its respawns, named by the instance."""
    view = stopped.systemd_view("vllmwatch@gpu1.service", _shown(FAILED), booted=True)
    text = stopped.explain("http://x:1/status", "/etc/vllmwatch/gpu1.toml", view, None)
    rows = {line.split()[0]: line for line in text.splitlines()}
    assert "restarts" not in rows, text
    assert "systemd restarted vllmwatch@gpu1 itself 4 times" in rows["respawns"], text
    assert "`journalctl -u vllmwatch@gpu1 -g daemon.exiting`" in rows["respawns"], text


def test_a_starting_unit_is_not_called_stopped() -> None:
    view = {"LoadState": "loaded", "ActiveState": "activating", "SubState": "start"}
    text = stopped.explain("http://x:1/status", "/etc/vllmwatch/vllmwatch.toml", view, None)
    assert "systemd says it is activating" in text and "systemctl start" not in text


def test_an_instance_looks_in_its_own_state_directory_only(tmp_path: Path) -> None:
    """A template instance with no record of its own showed another unit's newest record
    (/var/lib/vllmwatch/incidents) as its own "incident last"."""
    assert latest.instance_roots("vllmwatch@gpu0.service", ["/a"]) == [
        "/var/lib/vllmwatch/gpu0/incidents"]
    assert latest.instance_roots("vllmwatch.service", ["/a"]) == ["/a"]
    other = tmp_path / "incidents"
    (other / "20261201T000000Z-hang").mkdir(parents=True)
    (other / "20261201T000000Z-hang" / "record.json").write_text('{"reason": "hang"}')
    assert latest.newest(latest.instance_roots("vllmwatch@a.service", [str(other)],
                                               str(tmp_path))) is None


def test_show_finds_a_template_instances_record_by_its_id(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`vllmwatch incidents show ID`, the hint of a vllmwatch@NAME unit's log line, run from
    a shell (no STATE_DIRECTORY): the id is found in the instance's own folder."""
    from vllmwatch.incident import cli as incident_cli

    rid = "20261201T000000Z-hang"
    mine = tmp_path / "gpu1" / "incidents" / rid
    mine.mkdir(parents=True, mode=0o700)
    (mine / "record.json").write_text(json.dumps({"id": rid, "reason": "hang",
                                                  "detail": "canary timed out"}))
    default = tmp_path / "incidents"
    default.mkdir()
    assert incident_cli.main("show", rid, False, [str(default)], str(tmp_path)) == 0
    assert "reason: hang: canary timed out" in capsys.readouterr().out
    assert incident_cli.main("show", rid, False, [str(default)], None) == 1  # --dir: only it


def test_the_command_line_wires_the_incident_lookup(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "vllmwatch", "status", "--url",
                           f"127.0.0.1:{_free_port()}", "--config", str(tmp_path / "x.toml")],
                          capture_output=True, text=True, timeout=60 * TIMEOUT_SCALE, check=False,
                          env={**os.environ, "STATE_DIRECTORY": str(tmp_path)})
    assert proc.returncode == status_cli.EXIT_NOT_RUNNING and "Traceback" not in proc.stderr
    rid = _record(tmp_path / "incidents", "hang", "canary timed out", NOW)
    proc = subprocess.run([sys.executable, "-m", "vllmwatch", "status", "--url",
                           f"127.0.0.1:{_free_port()}", "--config", str(tmp_path / "x.toml")],
                          capture_output=True, text=True, timeout=60 * TIMEOUT_SCALE, check=False,
                          env={**os.environ, "STATE_DIRECTORY": str(tmp_path)})
    assert f"vllmwatch incidents show {rid}" in proc.stderr, proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_a_records_detail_is_redacted_before_it_is_cut(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record written unredacted (an older version's, a hand-copied one) with a token
    across the 160 characters `status` and `incidents --json` show: hidden whole, never its
    first part (too short for the token's shape once cut)."""
    token = "hf_" + "AbCdEfGhIjKlMnOpQrStUv0123"
    detail = "e" * 140 + " using token " + token  # the cut at 160 falls in the token
    root = tmp_path / "incidents"
    _record(root, "crash", detail, NOW)
    shown = latest.newest([str(root)])
    assert shown is not None and "hf_AbC" not in shown["detail"], shown
    (summary,) = incident_cli.summaries(str(root))
    assert "hf_AbC" not in summary.detail and len(summary.detail) <= 160, summary


def test_a_long_detail_keeps_its_cause_in_status_and_in_the_list(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A crash loop's detail says the guard's numbers first and the failure that ended it
    last: the list's 100 characters and status's 160 cut its end ("...; the last: crash:
    during st"), the cause a person reads both for. Each keeps its start and its end."""
    cause = "crash: during start: exited with code 1 (CUDA error: an illegal memory access)"
    detail = ("3 failures within 1h00m, 2 restarted (restart.window; restart.max_restarts 2); "
              "the last: " + "x" * 40 + " " + cause)
    root = tmp_path / "incidents"
    rid = _record(root, "crashloop", detail, NOW)
    shown = latest.newest([str(root)])
    assert shown is not None and shown["detail"].endswith(cause), shown
    assert shown["detail"].startswith("3 failures within 1h00m, 2 restarted") and \
        len(shown["detail"]) <= 160, shown
    assert incident_cli.main(None, None, False, [str(root)], None) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(rid))
    assert line.endswith("illegal memory access)") and "3 failures within" in line, line
    assert len(line[line.index("3 failures"):]) <= incident_cli.LIST_DETAIL, line


def test_a_unit_of_a_users_manager_is_found_and_its_commands_say_user() -> None:
    """vllmwatch under `systemctl --user`, stopped: `vllmwatch status` asked the system's
    manager alone (no such unit: no unit row, no exit) and said `systemctl start vllmwatch`,
    which answers "Unit vllmwatch.service not found". The user's manager is asked next, and
    every command then says --user."""
    asked: list[list[str]] = []

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        asked.append(cmd)
        user = "--user" in cmd
        return subprocess.CompletedProcess(cmd, 0, FAILED if user else "LoadState=not-found\n",
                                           "")
    view = stopped.systemd_view("vllmwatch.service", run, booted=True)
    assert view is not None and view["Manager"] == "user", view
    assert [c[:2] for c in asked] == [["systemctl", "show"], ["systemctl", "--user"]], asked
    text = stopped.explain("http://127.0.0.1:9101", "/x/vllmwatch.toml", view, None)
    commands = [c for c in text.replace("`", " ").split(";") if "ctl " in c]
    assert commands and all("--user" in c for c in commands), text
    assert "journalctl --user -xeu vllmwatch" in text and \
        "systemctl --user reset-failed vllmwatch && systemctl --user start vllmwatch" in text
    assert "a user manager" in text.splitlines()[1], text
    system = stopped.explain("http://x", "/x/vllmwatch.toml", {**view, "Manager": "system"},
                             None)
    assert "--user" not in system and "systemctl reset-failed vllmwatch" in system, system
