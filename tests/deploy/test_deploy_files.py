"""Deployment files, checked offline: hadolint, compose config, Kubernetes schemas, the routing YAML inside."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from tools.render_kustomize import render

BIN = Path(sys.executable).parent


def run(*cmd: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=120)


def test_dockerfile_is_clean_under_hadolint() -> None:
    result = run(str(BIN / "hadolint"), "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_runs_as_non_root_with_a_readiness_healthcheck() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "USER 10001" in text and "/readyz" in text and text.count("FROM ") == 2


@pytest.mark.parametrize(
    ("profile", "services"),
    [
        ("gpu", {"gateway", "vllm", "tgi", "trtllm", "llamacpp", "prometheus", "grafana", "redis"}),
        ("cpu", {"gateway-cpu", "llamacpp", "prometheus", "grafana", "redis"}),
    ],
)
def test_compose_file_is_valid_for_each_profile(profile: str, services: set[str]) -> None:
    compose = str(BIN / "docker-compose")
    check = run(compose, "-f", "docker-compose.yml", "--profile", profile, "config", "--quiet")
    assert check.returncode == 0, check.stderr
    listed = run(compose, "-f", "docker-compose.yml", "--profile", profile, "config", "--services")
    assert set(listed.stdout.split()) == services


def test_gpu_services_reserve_gpus_and_cpu_profile_needs_none() -> None:
    doc = yaml.safe_load(run(str(BIN / "docker-compose"), "-f", "docker-compose.yml", "--profile", "gpu",
                             "config").stdout)  # fmt: skip
    for name in ("vllm", "tgi", "trtllm"):
        devices = doc["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]
    cpu = yaml.safe_load(run(str(BIN / "docker-compose"), "-f", "docker-compose.yml", "--profile", "cpu",
                             "config").stdout)  # fmt: skip
    assert all("deploy" not in s for s in cpu["services"].values())


def config_check(path: Path) -> subprocess.CompletedProcess[str]:
    return run(sys.executable, "-m", "gateway.cli", "config", "check", str(path))


@pytest.mark.parametrize("config", ["configs/compose.yaml", "configs/compose-cpu.yaml", "configs/fleet-example.yaml"])
def test_shipped_configs_pass_config_check(config: str) -> None:
    result = config_check(ROOT / config)
    assert result.returncode == 0, result.stderr


def kinds(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


@pytest.mark.parametrize("base", ["deploy/k8s/gateway", "deploy/k8s/engines"])
def test_kustomize_bases_render_and_validate_strictly(base: str, tmp_path: Path) -> None:
    docs = render(ROOT / base)
    schema_checked = [d for d in docs if d["apiVersion"] != "monitoring.coreos.com/v1"]
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(schema_checked))
    result = run(str(BIN / "kubernetes-validate"), "--strict", "--quiet", str(rendered))
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(d["metadata"]["namespace"] for d in docs)


def test_gateway_manifests_fit_together() -> None:
    objs = kinds(render(ROOT / "deploy/k8s/gateway"))
    deployment, service = objs["Deployment/enginegate"], objs["Service/enginegate"]
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert objs["PodDisruptionBudget/enginegate"]["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert objs["HorizontalPodAutoscaler/enginegate"]["spec"]["scaleTargetRef"]["name"] == "enginegate"
    # The ServiceMonitor is a CRD without a bundled schema: check it against what it must select.
    monitor = objs["ServiceMonitor/enginegate"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    mounted = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert mounted["config"]["configMap"]["name"] == "enginegate-config"
    assert container["args"][:2] == ["--config", "/etc/enginegate/config.yaml"]
    # Several workers share metrics through a directory, which must be a writable volume (read-only root).
    assert "--workers" in container["args"] and container["securityContext"]["readOnlyRootFilesystem"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert "emptyDir" in mounted[mounts[env["PROMETHEUS_MULTIPROC_DIR"]]]


def test_engine_deployments_request_gpus_where_they_need_them() -> None:
    objs = kinds(render(ROOT / "deploy/k8s/engines"))
    gpus = {
        name.split("/")[1]: d["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"].get(
            "nvidia.com/gpu", 0
        )
        for name, d in objs.items()
        if name.startswith("Deployment/")
    }
    assert gpus == {"vllm": 1, "vllm-70b": 4, "tgi": 1, "trtllm": 1, "llamacpp": 0}


def test_routing_yaml_in_the_configmap_passes_config_check(tmp_path: Path) -> None:
    configmap = kinds(render(ROOT / "deploy/k8s/gateway"))["ConfigMap/enginegate-config"]
    path = tmp_path / "config.yaml"
    path.write_text(configmap["data"]["config.yaml"])
    result = config_check(path)
    assert result.returncode == 0, result.stderr
    # and every backend URL names a Service of the engine base
    services = {n.split("/")[1] for n in kinds(render(ROOT / "deploy/k8s/engines")) if n.startswith("Service/")}
    for backend in yaml.safe_load(configmap["data"]["config.yaml"])["backends"]:
        host = backend["url"].split("//")[1].split(".")[0]
        assert host in services, backend["name"]


def test_grafana_provisioning_points_at_the_dashboard_and_datasource() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/enginegate.json").read_text())
    source = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = source["datasources"][0]["uid"]
    assert dashboard["panels"] and all(p["datasource"]["uid"] == uid for p in dashboard["panels"])
    assert all(t["expr"].startswith(("sum", "rate", "histogram")) for p in dashboard["panels"] for t in p["targets"])
