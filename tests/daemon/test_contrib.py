"""contrib/ cannot drift from the code: alerts, dashboard and manifests checked here.

- Every metric name that the Grafana dashboard or the alert rules query is one that a real
  `vllmwatch run` (supervising the fake vLLM, READY, every probe kind completed) exposes.
- `promtool check rules` and `promtool test rules` (contrib/prometheus/tests.yml: input series
  and the expected alerts, for every alert). promtool comes from Debian's `prometheus`
  package, which scripts/test.sh installs when root; skipped with the reason otherwise.
- Every dashboard query is accepted by a real Prometheus scraping that daemon (the
  `prometheus` binary of the same package), so a PromQL typo cannot ship.
- The daemon's exposition passes `promtool check metrics` (Prometheus naming lint).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import PYTHON, REPO, TIMEOUT_SCALE, Daemon, free_port, wait_for

CONTRIB = REPO / "contrib"
RULES = CONTRIB / "prometheus" / "vllmwatch-alerts.yml"
RULE_TESTS = CONTRIB / "prometheus" / "tests.yml"
DASHBOARD = CONTRIB / "grafana" / "vllmwatch.json"
SCRAPE_ONLY = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}  # made by the scrape

# PromQL words that look like metric names.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
             "unless", "offset", "bool", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, labels and keywords removed)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    expr = re.sub(r"\$\{?\w+\}?", "1m", expr)  # Grafana variables
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for m in re.finditer(r"(?<![\w.:])([a-zA-Z_:][\w:]*)(\s*\()?", expr):
        if not m.group(2) and m.group(1).lower() not in _KEYWORDS:
            names.add(m.group(1))
    return names


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (reason) (increase(vllmwatch_restarts_total{job=~"$job"}[$__rate_interval]))',
     {"vllmwatch_restarts_total"}),
    ('a / on(instance, job, kind) b{kind="x"} > 0.9', {"a", "b"}),
    ("time() - x_timestamp_seconds and on(instance) y == 1", {"x_timestamp_seconds", "y"}),
    ('max_over_time(vllmwatch_info{model="a:b"}[1d]) offset 5m', {"vllmwatch_info"}),
    ("process_resident_memory_bytes / 2^30", {"process_resident_memory_bytes"}),
])
def test_metric_names_are_read_from_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def dashboard_exprs() -> list[str]:
    """Every PromQL query of the dashboard: panels (rows included), annotations, variables."""
    dash = json.loads(DASHBOARD.read_text())
    exprs: list[str] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            exprs.extend(t["expr"] for t in panel.get("targets", []) if t.get("expr"))
            walk(panel.get("panels", []))

    walk(dash["panels"])
    exprs += [a["expr"] for a in dash.get("annotations", {}).get("list", []) if a.get("expr")]
    for var in dash["templating"]["list"]:
        query = var.get("query")
        if var["type"] == "query":
            text = query["query"] if isinstance(query, dict) else query
            # label_values(METRIC, LABEL): the label is not a metric.
            exprs.append(re.sub(r",\s*\w+\)\s*$", ")", text).replace("label_values", ""))
    return exprs


def rule_exprs() -> list[str]:
    """Every expression of the alert rules."""
    doc = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in doc["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A real daemon supervising the fake vLLM, READY, with every probe kind completed."""
    fake = [PYTHON, "-m", "vllmwatch.testing.fake_vllm", "--startup-seconds", "0.3"]
    config = {
        "vllm": {"command": fake, "model": "tiny", "port": free_port(), "gpus": []},
        "probe": {"interval": "0.5s", "timeout": "1s", "canary_interval": "1s",
                  "canary_timeout": "1s", "metrics_interval": "0.5s"},
        "memory": {"gpu_limit": "70GiB", "host_limit": "64GiB"},
        "prewarm": {"enabled": False},
        "status": {"listen": f"127.0.0.1:{free_port()}"},
    }
    d = Daemon(tmp_path_factory.mktemp("contrib"), config).start()
    try:
        d.wait_ready()

        def all_probes_done() -> bool:
            done = json.loads(d.http_get("/status")[1]).get("probe_last_completed", {})
            return {"health", "canary", "metrics", "memory"} <= set(done)

        wait_for(all_probes_done, 10.0, "every probe kind to complete once")
        yield d
    finally:
        d.close()


@pytest.fixture(scope="module")
def exposed(daemon: Daemon) -> set[str]:
    """Metric names on the daemon's /metrics: declared families and the samples' names."""
    code, body = daemon.http_get("/metrics")
    assert code == 200
    names = set()
    for line in body.decode().splitlines():
        if line.startswith("# TYPE ") or line.startswith("# HELP "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_the_daemon_exposes_the_documented_families(exposed: set[str]) -> None:
    for name in ("vllmwatch_info", "vllmwatch_state", "vllmwatch_ready",
                 "vllmwatch_restarts_total", "vllmwatch_startup_phase_reached_seconds",
                 "vllmwatch_probe_last_completed_timestamp_seconds",
                 "vllmwatch_status_rejected_total", "vllmwatch_memory_limit_bytes",
                 "vllmwatch_memory_rule_bytes", "process_start_time_seconds"):
        assert name in exposed, name


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_contrib_queries_only_metrics_the_daemon_exposes(source: str, exposed: set[str]) -> None:
    exprs = dashboard_exprs() if source == "dashboard" else rule_exprs()
    used = set().union(*(metric_names(e) for e in exprs))
    assert len(used) >= 8, used  # the extraction found the queries
    missing = used - exposed - SCRAPE_ONLY
    assert not missing, f"{source} uses metrics no running vllmwatch exposes: {sorted(missing)}"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian package `prometheus`; scripts/test.sh "
                    "installs it when run as root)")
    return path


def test_promtool_check_rules() -> None:
    out = subprocess.run([_tool("promtool"), "check", "rules", str(RULES)],
                         capture_output=True, text=True, timeout=60 * TIMEOUT_SCALE, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_test_rules_covers_every_alert() -> None:
    out = subprocess.run([_tool("promtool"), "test", "rules", str(RULE_TESTS)],
                         capture_output=True, text=True, timeout=60 * TIMEOUT_SCALE, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing = {case["alertname"] for t in tests for case in t["alert_rule_test"]
              if case["exp_alerts"]}
    assert alerts == firing, f"alerts without a firing test case: {sorted(alerts - firing)}"


def _query(port: int, expr: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10 * TIMEOUT_SCALE) as resp:
            return dict(json.load(resp))
    except urllib.error.HTTPError as exc:  # 400 carries the parse error
        return dict(json.load(exc))


def test_dashboard_queries_run_in_prometheus(daemon: Daemon, tmp_path: Path) -> None:
    prometheus = _tool("prometheus")
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "vllmwatch",
                            "static_configs": [{"targets": [daemon.status_listen]}]}]}))
    proc = subprocess.Popen(
        [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def scraped() -> bool:
            try:
                return bool(_query(port, "vllmwatch_ready == 1")["data"]["result"])
            except (OSError, ValueError, KeyError):  # not listening yet, or 503 while starting
                return False

        wait_for(scraped, 20.0, "Prometheus to scrape a ready vllmwatch")
        errors, empty = [], []
        for expr in dashboard_exprs():
            promql = re.sub(r"\$__\w+", "1m", expr).replace('"$job"', '"vllmwatch"')
            promql = re.sub(r'"\$\w+"', '".*"', promql)
            answer = _query(port, promql)
            if answer.get("status") != "success":
                errors.append(f"{expr}: {answer.get('error')}")
            elif not answer["data"]["result"]:
                empty.append(expr)
        assert not errors, "\n".join(errors)
        print("\n[dashboard] queries without data here (no GPU, no restart yet):\n  "
              + "\n  ".join(empty))
        # What a ready daemon on any machine has: the core panels must show data.
        for name in ("vllmwatch_ready", "vllmwatch_state", "vllmwatch_info",
                     "vllmwatch_startup_phase_reached_seconds", "vllmwatch_probe_duration_seconds",
                     "vllmwatch_probe_last_completed_timestamp_seconds",
                     "vllmwatch_host_memory_bytes"):
            assert not [e for e in empty if name in e], (name, empty)
        up = _query(port, 'up{job="vllmwatch"}')["data"]["result"]
        assert [r["value"][1] for r in up] == ["1"]
        # The alerts' joins match real series (their thresholds left out).
        joins = {
            'vllmwatch_memory_rule_bytes{kind="host"} / on(instance, job, kind) '
            'vllmwatch_memory_limit_bytes{kind="host"}': 1,
            '(time() - vllmwatch_probe_last_completed_timestamp_seconds'
            '{probe=~"health|canary|metrics|memory"}) and on(instance, job) '
            'vllmwatch_ready == 1': 4,
            "vllmwatch_probe_stale": 4,
        }
        for expr, series in joins.items():
            assert len(_query(port, expr)["data"]["result"]) == series, expr
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5 * TIMEOUT_SCALE)


def test_operations_doc_names_every_metric_and_alert(exposed: set[str]) -> None:
    chapter = (REPO / "docs" / "operations" / "fleet.md").read_text()
    families = {n for n in exposed if n.startswith("vllmwatch_") and not n.endswith("_created")}
    # Families documented together: `vllmwatch_vllm_requests_running`, `..._waiting`.
    undocumented = {n for n in families
                    if f"`{n}`" not in chapter and f"`..._{n.rsplit('_', 1)[-1]}`" not in chapter}
    assert not undocumented, f"metrics missing from operations/fleet.md: {sorted(undocumented)}"
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert not {a for a in alerts if f"`{a}`" not in chapter}


# A probe past the crowd answers well before the idle clients are cut (the status server's
# 5 s client deadline): 1 s, scaled for a loaded box, but never so far that a probe queued
# behind the crowd until the cut could pass.
PROBE_S = min(1.0 * TIMEOUT_SCALE, 4.0)


def _rejected(daemon: Daemon, reason: str) -> float:
    body = daemon.http_get("/metrics")[1].decode()
    match = re.search(rf'^vllmwatch_status_rejected_total{{reason="{reason}"}} (\S+)$', body,
                      re.MULTILINE)
    return float(match.group(1)) if match else -1.0


def test_the_real_daemon_answers_probes_past_a_crowd_of_idle_clients(daemon: Daemon) -> None:
    """Wired as in production: probes in time, the idle clients cut, counted and logged once."""
    host, port = daemon.status_listen.rsplit(":", 1)
    since, before = daemon.mark(), _rejected(daemon, "timeout")
    crowd = [socket.create_connection((host, int(port)), timeout=5 * TIMEOUT_SCALE)
             for _ in range(100)]
    try:
        for path, expected in (("/livez", 200), ("/readyz", 200)):
            began = time.monotonic()
            assert daemon.http_get(path)[0] == expected
            assert time.monotonic() - began < PROBE_S, path
        wait_for(lambda: _rejected(daemon, "timeout") >= before + 100, 10.0,
                 "the idle clients to be cut at the 5 s deadline and counted")
    finally:
        for sock in crowd:
            sock.close()
    logged = daemon.named("status.rejected", since)
    assert len(logged) == 1, logged  # the first at once, the rest within the minute's limit
    assert logged[0]["counts"] == {"timeout": 1}


def test_exposition_passes_promtools_naming_lint(daemon: Daemon) -> None:
    """`promtool check metrics`: base units, _total on counters, no reserved suffixes."""
    code, body = daemon.http_get("/metrics")
    assert code == 200
    out = subprocess.run([_tool("promtool"), "check", "metrics"], input=body,
                         capture_output=True, timeout=60 * TIMEOUT_SCALE, check=False)
    assert out.returncode == 0 and not out.stdout.strip(), (out.stdout + out.stderr).decode()


def test_dashboard_layout_is_sound() -> None:
    """Unique panel ids, every panel inside the 24-column grid, no two panels overlapping,
    every query panel on the data source variable."""
    dash = json.loads(DASHBOARD.read_text())
    panels = dash["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
