"""contrib/kubernetes: schema-valid, and consistent with vllmwatch and with each other.

The manifests are validated against the Kubernetes OpenAPI schemas (kubernetes-validate,
strict: unknown fields refused) for the oldest and newest versions it ships; the
ServiceMonitor (a CRD it has no schema for) is checked by structure. They have not been
applied to a cluster here. The consistency checks are what a schema cannot see: the
ConfigMap's TOML loads with vllmwatch's own loader, the status listener is reachable from
outside the pod, probes and ServiceMonitor name ports that exist, and the grace period
covers preStop plus vllmwatch's stop ladder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vllmwatch.config.schema import load
from vllmwatch.status.server import parse_listen

# pyyaml is a dev extra (the contrib/ tests); without it this file skips and the rest of the
# core tier still collects and runs.
yaml = pytest.importorskip("yaml", reason="pyyaml not installed (pip install -e '.[dev]')")

K8S = Path(__file__).resolve().parents[2] / "contrib" / "kubernetes"
BUILTIN = ("configmap.yaml", "deployment.yaml", "service.yaml")


def doc(name: str) -> dict[str, Any]:
    """The one resource in a manifest file."""
    return dict(yaml.safe_load((K8S / name).read_text()))


def container() -> dict[str, Any]:
    return dict(doc("deployment.yaml")["spec"]["template"]["spec"]["containers"][0])


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("version", ["1.29.0", "latest"])
def test_manifests_pass_the_kubernetes_schema(name: str, version: str) -> None:
    kv = pytest.importorskip("kubernetes_validate",
                             reason="kubernetes-validate is not installed (pip install -e .[dev])")
    if version == "latest":
        version = kv.latest_version()
    kv.validate(doc(name), version, strict=True)  # raises ValidationError with the field


def test_the_validator_refuses_a_broken_manifest() -> None:
    kv = pytest.importorskip("kubernetes_validate",
                             reason="kubernetes-validate is not installed (pip install -e .[dev])")
    broken = doc("deployment.yaml")
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, kv.latest_version(), strict=True)


def test_the_config_loads_and_listens_where_the_probes_look(tmp_path: Path) -> None:
    toml = tmp_path / "vllmwatch.toml"
    toml.write_text(doc("configmap.yaml")["data"]["vllmwatch.toml"])
    config = load(str(toml))  # raises ConfigError naming the key on a bad value
    listen = parse_listen(config.status.listen)
    assert listen is not None
    host, port = listen
    assert host in ("0.0.0.0", "::", "") and config.status.allow_remote, \
        "a loopback status listener is unreachable for the kubelet and Prometheus"
    c = container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["status"] == port and ports["http"] == config.vllm.port
    assert config.vllm.host == "0.0.0.0"
    for probe, path in (("startupProbe", "/readyz"), ("readinessProbe", "/readyz"),
                        ("livenessProbe", "/livez")):
        assert c[probe]["httpGet"] == {"path": path, "port": "status"}, probe
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert c["command"][-1] == f"{mounts['config']}/vllmwatch.toml"


def test_the_grace_period_covers_prestop_and_the_stop_ladder(tmp_path: Path) -> None:
    toml = tmp_path / "vllmwatch.toml"
    toml.write_text(doc("configmap.yaml")["data"]["vllmwatch.toml"])
    config = load(str(toml))
    spec = doc("deployment.yaml")["spec"]["template"]["spec"]
    pre_stop = spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    shutdown = float(str(config.vllm.args.get("shutdown-timeout", 0)))
    assert config.restart.stop_timeout > shutdown, "SIGKILL would cut vLLM's own drain short"
    assert spec["terminationGracePeriodSeconds"] >= \
        float(pre_stop[1]) + config.restart.stop_timeout + 10


def test_service_and_servicemonitor_select_the_pods_and_the_status_port() -> None:
    pod_labels = doc("deployment.yaml")["spec"]["template"]["metadata"]["labels"]
    service = doc("service.yaml")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = doc("servicemonitor.yaml")
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1",
                                                        "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    port_names = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names and endpoint["path"] == "/metrics"
        job = [r for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
        assert job and job[0]["replacement"] == "vllmwatch"  # what the alert rules expect
